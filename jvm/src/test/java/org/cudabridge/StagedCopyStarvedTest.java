package org.cudabridge;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * StagedCopyThreadsTest's sixteen threads with one staging slot per GPU and a staging wait of 1 us:
 * on a GPU most copies find no slot in time and go through pageable memory (counted as
 * staging_fallbacks_pageable), and every byte still arrives. A JVM of its own: the bridge's
 * settings are fixed for its JVM.
 */
@Tag("own-jvm")
class StagedCopyStarvedTest {
    @Test
    void withNoSlotInTimeCopiesGoThroughPageableMemoryEveryByteChecked() throws Exception {
        StagedCopyThreadsTest.sixteenThreads(true);
    }
}
