package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class InstallLayoutTest {
    @TempDir
    Path dir;

    /** {@code <prefix>/lib/python3.N/site-packages/cudabridge/_native} with a library, and
     *  {@code <prefix>/bin/python} (an executable file). */
    private Path installedEnvironment(Path prefix, String pythonDir) throws Exception {
        Path nativeDir = prefix.resolve("lib").resolve(pythonDir).resolve("site-packages").resolve("cudabridge")
                .resolve("_native");
        Files.createDirectories(nativeDir);
        Files.writeString(nativeDir.resolve(InstallLayout.LIBRARY_FILE), "x");
        Files.createDirectories(prefix.resolve("bin"));
        Path python = prefix.resolve("bin").resolve("python");
        Files.writeString(python, "#!/bin/sh\n");
        Files.setPosixFilePermissions(python, PosixFilePermissions.fromString("rwxr-xr-x"));
        return nativeDir;
    }

    @Test
    void findsOnlyFilesThatExistInTheDirectory() throws Exception {
        InstallLayout layout = InstallLayout.of(dir);
        assertNull(layout.library());
        Files.writeString(dir.resolve(InstallLayout.LIBRARY_FILE), "x");
        assertEquals(dir.resolve(InstallLayout.LIBRARY_FILE).toString(), layout.library());
        Files.createDirectory(dir.resolve("adir"));
        assertNull(layout.file("adir"), "a directory is not a file");
    }

    @Test
    void readsTheBuildsProperties() throws Exception {
        Files.writeString(dir.resolve(InstallLayout.NATIVE_PROPERTIES), "python=/venv/bin/python\nlibrary.file=x.so\n");
        InstallLayout layout = InstallLayout.of(dir);
        assertEquals(dir.resolve(InstallLayout.NATIVE_PROPERTIES), layout.nativePropertiesFile());
        assertEquals("/venv/bin/python", layout.nativeProperties().getProperty("python"));
        assertEquals("x.so", layout.nativeProperties().getProperty("library.file"));
    }

    @Test
    void noPropertiesFileOrAnUnreadableOneGivesNoDefaults() throws Exception {
        assertTrue(InstallLayout.of(dir).nativeProperties().isEmpty());
        assertTrue(InstallLayout.of(null).nativeProperties().isEmpty());
        assertNull(InstallLayout.of(null).library());
        Files.writeString(dir.resolve(InstallLayout.NATIVE_PROPERTIES), "bad=\\u00zz\n");   // a malformed escape
        assertTrue(InstallLayout.of(dir).nativeProperties().isEmpty());
    }

    @Test
    void anInstalledPackageGivesItsEnvironmentsInterpreterAndPackageDirectory() throws Exception {
        Path prefix = dir.resolve("env");
        Path nativeDir = installedEnvironment(prefix, "python3.11");
        InstallLayout layout = InstallLayout.of(nativeDir);
        assertEquals(prefix.resolve("lib/python3.11/site-packages").toString(), layout.packageParent());
        assertEquals(prefix.resolve("bin/python").toString(), layout.environmentPython());
    }

    @Test
    void aSourceTreeHasAPackageDirectoryButNoEnvironmentInterpreter() throws Exception {
        Path nativeDir = dir.resolve("repo/python/cudabridge/_native");
        Files.createDirectories(nativeDir);
        InstallLayout layout = InstallLayout.of(nativeDir);
        assertEquals(dir.resolve("repo/python").toString(), layout.packageParent());
        assertNull(layout.environmentPython());
        assertNull(InstallLayout.of(dir).packageParent(), "not a package's _native directory");
    }

    @Test
    void theConfiguredPythonsEnvironmentHoldsTheLibraryWhereTheJarsWereCopied() throws Exception {
        Path prefix = dir.resolve("env");
        Path nativeDir = installedEnvironment(prefix, "python3.12");
        InstallLayout layout = InstallLayout.ofPython(prefix.resolve("bin/python").toString());
        assertEquals(nativeDir.resolve(InstallLayout.LIBRARY_FILE).toString(), layout.library());
        assertNull(InstallLayout.ofPython(dir.resolve("other/bin/python").toString()).library(), "no such environment");
        assertNull(InstallLayout.ofPython("python3").library(), "a bare name is looked up on PATH, not here");
        assertNull(InstallLayout.ofPython(null).library());
    }

    @Test
    void theJarsOwnLayoutIsTheDirectoryOfTheJar() {
        String library = InstallLayout.ofJar().library();
        // the build writes the library beside cudabridge.jar, which this test runs against
        assertTrue(library != null && library.endsWith(InstallLayout.LIBRARY_FILE), String.valueOf(library));
    }
}
