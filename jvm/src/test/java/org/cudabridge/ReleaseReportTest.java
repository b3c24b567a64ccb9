package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import org.junit.jupiter.api.Test;

class ReleaseReportTest {
    @Test
    void aReleaseCountsItsLeaks() {
        ReleaseReport r = ReleaseReport.of(7, 2, 8192);
        assertEquals(new ReleaseReport(7, 2, 8192, null), r);
        assertNull(r.failure());
        assertEquals("ReleaseReport(task 7: 2 leak(s) reclaimed, 8192 bytes)", r.toString());
        assertEquals(ReleaseReport.of(9, 0, 0), ReleaseReport.empty(9));
    }

    @Test
    void aFailedReleaseSaysWhyAndReclaimedNothing() {
        ReleaseReport r = ReleaseReport.failed(5, "UnknownTask: task 5 is not bound");
        assertEquals(0, r.leaksReclaimed());
        assertEquals(0, r.leakedBytesReclaimed());
        assertEquals("ReleaseReport(task 5: failed: UnknownTask: task 5 is not bound)", r.toString());
    }
}
