package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class PriorityTest {

    @Test
    void wireNamesAreLowerCaseAndToStringIsTheWireName() {
        assertEquals("normal", Priority.NORMAL.wire());
        assertEquals("high", Priority.HIGH.wire());
        assertEquals("high", Priority.HIGH.toString());
    }

    @Test
    void fromWireReadsEveryConstantsWireName() {
        for (Priority p : Priority.values()) {
            assertSame(p, Priority.fromWire(p.wire()));
        }
    }

    @Test
    void fromWireIsCaseSensitiveAndNamesTheAcceptedNames() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Priority.fromWire("HIGH"));
        assertEquals("priority must be one of normal, high, got HIGH", e.getMessage());
        // the enum constant's Java name is not a wire name either
        assertThrows(IllegalArgumentException.class, () -> Priority.fromWire("NORMAL"));
    }

    @Test
    void fromWireRefusesNull() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Priority.fromWire(null));
        assertEquals("priority must be one of normal, high, got null", e.getMessage());
    }

    @Test
    void wireNamesAreTheSettingsTablesTaskPriorityValues() {
        List<String> wires = new ArrayList<>();
        for (Priority p : Priority.values()) {
            wires.add(p.wire());
        }
        assertEquals(SettingsTable.TASK_PRIORITY.values(), wires);
        assertEquals(Priority.NORMAL.wire(), SettingsTable.TASK_PRIORITY.defaultValue());
    }
}
