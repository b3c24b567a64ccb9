package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayList;
import java.util.List;

import org.junit.jupiter.api.Test;

/** DType: its constants are the jar's dtypes table (functions/dtypes.py's DTYPES), in code order. */
class DTypeTest {
    @Test
    void theConstantsAreTheSharedTableInCodeOrder() {
        List<String> names = new ArrayList<>();
        for (DType t : DType.values()) {
            names.add(t.pythonName());
            assertEquals(t, DType.ofCode(t.code()));
        }
        assertEquals(BuildTables.lines(BuildTables.DTYPES), names);
    }

    @Test
    void itemSizesAreTheElementWidths() {
        assertEquals(1, DType.BOOL.itemSize());
        assertEquals(2, DType.INT16.itemSize());
        assertEquals(4, DType.FLOAT32.itemSize());
        assertEquals(8, DType.INT64.itemSize());
        assertEquals(8, DType.FLOAT64.itemSize());
    }

    @Test
    void anUnknownCodeIsRefused() {
        assertThrows(IllegalStateException.class, () -> DType.ofCode(-1));
        assertThrows(IllegalStateException.class, () -> DType.ofCode(DType.values().length));
    }
}
