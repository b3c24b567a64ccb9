package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class InstallLayoutTest {
    @TempDir
    Path dir;

    @Test
    void findsOnlyFilesThatExistBesideTheJar() throws Exception {
        InstallLayout layout = InstallLayout.of(dir);
        assertNull(layout.besideJar(InstallLayout.LIBRARY_FILE));
        Files.writeString(dir.resolve(InstallLayout.LIBRARY_FILE), "x");
        assertEquals(dir.resolve(InstallLayout.LIBRARY_FILE).toString(), layout.besideJar(InstallLayout.LIBRARY_FILE));
        Files.createDirectory(dir.resolve("adir"));
        assertNull(layout.besideJar("adir"), "a directory is not a file");
    }

    @Test
    void readsTheBuildsProperties() throws Exception {
        Files.writeString(dir.resolve(InstallLayout.NATIVE_PROPERTIES), "python=/venv/bin/python\nlibrary=/x/lib.so\n");
        InstallLayout layout = InstallLayout.of(dir);
        assertEquals(dir.resolve(InstallLayout.NATIVE_PROPERTIES), layout.nativePropertiesFile());
        assertEquals("/venv/bin/python", layout.nativeProperties().getProperty("python"));
        assertEquals("/x/lib.so", layout.nativeProperties().getProperty("library"));
    }

    @Test
    void noPropertiesFileOrAnUnreadableOneGivesNoDefaults() throws Exception {
        assertTrue(InstallLayout.of(dir).nativeProperties().isEmpty());
        assertTrue(InstallLayout.of(null).nativeProperties().isEmpty());
        assertNull(InstallLayout.of(null).besideJar(InstallLayout.LIBRARY_FILE));
        Files.writeString(dir.resolve(InstallLayout.NATIVE_PROPERTIES), "bad=\\u00zz\n");   // a malformed escape
        assertTrue(InstallLayout.of(dir).nativeProperties().isEmpty());
    }

    @Test
    void theJarsOwnLayoutIsTheDirectoryOfTheJar() {
        String library = InstallLayout.ofJar().besideJar(InstallLayout.LIBRARY_FILE);
        // the build writes the library beside cudabridge.jar, which this test runs against
        assertTrue(library != null && library.endsWith(InstallLayout.LIBRARY_FILE), String.valueOf(library));
    }
}
