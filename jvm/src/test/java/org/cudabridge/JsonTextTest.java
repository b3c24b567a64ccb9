package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.LinkedHashMap;
import java.util.Map;

import org.junit.jupiter.api.Test;

class JsonTextTest {
    @Test
    void keysAreSortedAndEveryValueIsAString() {
        Map<String, String> m = new LinkedHashMap<>();
        m.put("spark.cudabridge.b", "2");
        m.put("spark.cudabridge.a", "x");
        assertEquals("{\"spark.cudabridge.a\":\"x\",\"spark.cudabridge.b\":\"2\"}", JsonText.object(m));
    }

    @Test
    void anEmptyMapIsAnEmptyObject() {
        assertEquals("{}", JsonText.object(Map.of()));
    }

    @Test
    void quotesBackslashesControlAndNonAsciiCharactersAreEscaped() {
        assertEquals("{\"k\":\"a\\\"b\\\\c\\u000a\\u00e9\\u20ac\"}", JsonText.object(Map.of("k", "a\"b\\c\n\u00e9\u20ac")));
    }
}
