package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class BridgeOptionsTest {
    @TempDir
    Path dir;

    @Test
    void serviceKeysAreKeptWithTheSparkPrefix() {
        BridgeOptions o = new BridgeOptions().set("backend", "emulated").set("spark.cudabridge.poolLimit", "1g");
        assertEquals(Map.of("spark.cudabridge.backend", "emulated", "spark.cudabridge.poolLimit", "1g"), o.conf());
        assertThrows(NullPointerException.class, () -> o.set("backend", null));
        assertThrows(UnsupportedOperationException.class, () -> o.conf().put("x", "y"));
    }

    @Test
    void setAllTakesOnlyTheCudabridgeKeys() {
        BridgeOptions o = new BridgeOptions().setAll(Map.of("spark.cudabridge.backend", "emulated",
                "spark.executor.memory", "1g"));
        assertEquals(Map.of("spark.cudabridge.backend", "emulated"), o.conf());
    }

    @Test
    void givenValuesWinOverEveryFallback() throws Exception {
        Files.writeString(dir.resolve(InstallLayout.NATIVE_PROPERTIES),
                "python=/built/python\nlibrary=/built/lib.so\npythonpath=/built/a" + File.pathSeparator + "/given\n");
        BridgeOptions r = new BridgeOptions().python("/given/python").library("/given/lib.so").addPythonPath("/given")
                .resolved(InstallLayout.of(dir));
        assertEquals("/given/python", r.python());
        assertEquals("/given/lib.so", r.library());
        // the given entries first, then the build's, each once; a -Dcudabridge.pythonPath may add more between
        List<String> path = r.pythonPath();
        assertEquals("/given", path.get(0));
        assertEquals("/built/a", path.get(path.size() - 1));
        assertEquals(path.size(), path.stream().distinct().count());
    }

    @Test
    void theBuildsPropertiesFillWhatNothingElseGives() throws Exception {
        Files.writeString(dir.resolve(InstallLayout.NATIVE_PROPERTIES), "library=/built/lib.so\n");
        String property = System.getProperty(Settings.LIBRARY);
        try {
            System.clearProperty(Settings.LIBRARY);
            assertEquals("/built/lib.so", new BridgeOptions().resolved(InstallLayout.of(dir)).library());
            Files.writeString(dir.resolve(InstallLayout.LIBRARY_FILE), "x");
            Files.delete(dir.resolve(InstallLayout.NATIVE_PROPERTIES));
            assertEquals(dir.resolve(InstallLayout.LIBRARY_FILE).toString(),
                    new BridgeOptions().resolved(InstallLayout.of(dir)).library(), "else the library beside the jar");
            System.setProperty(Settings.LIBRARY, "/property/lib.so");
            assertEquals("/property/lib.so", new BridgeOptions().resolved(InstallLayout.of(dir)).library(),
                    "a system property comes before the jar's directory");
        } finally {
            if (property == null) {
                System.clearProperty(Settings.LIBRARY);
            } else {
                System.setProperty(Settings.LIBRARY, property);
            }
        }
    }

    @Test
    void fromSystemPropertiesTakesTheSparkCudabridgeProperties() {
        System.setProperty("spark.cudabridge.poolGrowth", "chunks");
        try {
            assertEquals("chunks", BridgeOptions.fromSystemProperties().conf().get("spark.cudabridge.poolGrowth"));
        } finally {
            System.clearProperty("spark.cudabridge.poolGrowth");
        }
    }
}
