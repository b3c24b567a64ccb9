package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
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

    /** A package installed in {@code <prefix>}: its _native directory with a library. */
    private Path installed(Path prefix) throws Exception {
        Path nativeDir = prefix.resolve("lib/python3.11/site-packages/cudabridge/_native");
        Files.createDirectories(nativeDir);
        Files.writeString(nativeDir.resolve(InstallLayout.LIBRARY_FILE), "x");
        Files.createDirectories(prefix.resolve("bin"));
        Path python = prefix.resolve("bin/python");
        Files.writeString(python, "#!/bin/sh\n");
        Files.setPosixFilePermissions(python, PosixFilePermissions.fromString("rwxr-xr-x"));
        return nativeDir;
    }

    /** Runs {@code body} with the JVM-scope properties cleared (dev/junit sets some). */
    private static void withoutJvmProperties(Runnable body) {
        String[] keys = {SettingsTable.LIBRARY_PROPERTY.key(), SettingsTable.PYTHON_PROPERTY.key(),
                SettingsTable.PYTHON_PATH_PROPERTY.key()};
        String[] saved = new String[keys.length];
        for (int i = 0; i < keys.length; i++) {
            saved[i] = System.getProperty(keys[i]);
            System.clearProperty(keys[i]);
        }
        try {
            body.run();
        } finally {
            for (int i = 0; i < keys.length; i++) {
                if (saved[i] != null) {
                    System.setProperty(keys[i], saved[i]);
                }
            }
        }
    }

    @Test
    void givenValuesWinOverEveryFallback() throws Exception {
        Path nativeDir = installed(dir.resolve("env"));
        withoutJvmProperties(() -> {
            BridgeOptions r = new BridgeOptions().python("/given/python").library("/given/lib.so")
                    .addPythonPath("/given").resolved(InstallLayout.of(nativeDir));
            assertEquals("/given/python", r.python());
            assertEquals("/given/lib.so", r.library());
            assertEquals(List.of("/given"), r.pythonPath(), "the given library's directory is no package's");
        });
    }

    @Test
    void anInstalledPackageBesideTheJarGivesTheLibraryItsInterpreterAndItsPackageDirectory() throws Exception {
        Path prefix = dir.resolve("env");
        Path nativeDir = installed(prefix);
        withoutJvmProperties(() -> {
            BridgeOptions r = new BridgeOptions().resolved(InstallLayout.of(nativeDir));
            assertEquals(nativeDir.resolve(InstallLayout.LIBRARY_FILE).toString(), r.library());
            if (System.getenv(BridgeOptions.PYTHON_ENV) == null) {
                assertEquals(prefix.resolve("bin/python").toString(), r.python());
            }
            assertEquals(List.of(prefix.resolve("lib/python3.11/site-packages").toString()), r.pythonPath());
        });
    }

    @Test
    void jarsCopiedAwayFindTheLibraryInTheConfiguredPythonsEnvironment() throws Exception {
        // Spark's --jars: the jar is a copy in the executor's directory; --archives brought the environment
        Path prefix = dir.resolve("env");
        Path nativeDir = installed(prefix);
        Path copies = Files.createDirectories(dir.resolve("executor"));
        withoutJvmProperties(() -> {
            BridgeOptions r = new BridgeOptions().python(prefix.resolve("bin/python").toString())
                    .resolved(InstallLayout.of(copies));
            assertEquals(nativeDir.resolve(InstallLayout.LIBRARY_FILE).toString(), r.library());
            assertEquals(List.of(prefix.resolve("lib/python3.11/site-packages").toString()), r.pythonPath());
            BridgeOptions none = new BridgeOptions().python(dir.resolve("other/bin/python").toString())
                    .resolved(InstallLayout.of(copies));
            assertNull(none.library(), "no library anywhere: the start says where it looked");
        });
    }

    @Test
    void aSourceTreesBuildRecordsItsInterpreter() throws Exception {
        Path nativeDir = Files.createDirectories(dir.resolve("repo/python/cudabridge/_native"));
        Files.writeString(nativeDir.resolve(InstallLayout.LIBRARY_FILE), "x");
        Files.writeString(nativeDir.resolve(InstallLayout.NATIVE_PROPERTIES), "python=/repo/.venv/bin/python\n");
        withoutJvmProperties(() -> {
            BridgeOptions r = new BridgeOptions().resolved(InstallLayout.of(nativeDir));
            if (System.getenv(BridgeOptions.PYTHON_ENV) == null) {
                assertEquals("/repo/.venv/bin/python", r.python());
            }
            assertEquals(List.of(dir.resolve("repo/python").toString()), r.pythonPath());
        });
    }

    @Test
    void aSystemPropertyLibraryComesBeforeTheJarsDirectory() throws Exception {
        Path nativeDir = installed(dir.resolve("env"));
        withoutJvmProperties(() -> {
            System.setProperty(SettingsTable.LIBRARY_PROPERTY.key(), "/property/lib.so");
            try {
                assertEquals("/property/lib.so", new BridgeOptions().resolved(InstallLayout.of(nativeDir)).library());
            } finally {
                System.clearProperty(SettingsTable.LIBRARY_PROPERTY.key());
            }
        });
    }

    @Test
    void aRelativeInterpreterPathIsMadeAbsolute() {
        withoutJvmProperties(() -> {
            BridgeOptions r = new BridgeOptions().python("./env/bin/python").resolved(InstallLayout.of(null));
            assertEquals(Path.of("env/bin/python").toAbsolutePath().toString(), r.python());
            assertEquals("python3", new BridgeOptions().python("python3").resolved(InstallLayout.of(null)).python());
        });
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
