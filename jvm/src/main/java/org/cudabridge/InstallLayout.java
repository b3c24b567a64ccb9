package org.cudabridge;

import java.io.IOException;
import java.io.InputStream;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.CodeSource;
import java.util.Properties;

/**
 * What the build put beside {@code cudabridge.jar}: the bridge library and
 * {@code cudabridge-native.properties} (the Python, its path and the library's recorded size and
 * SHA-256, written by {@code python -m cudabridge build}). Files are looked up in the directory
 * the jar (or the class directory) was loaded from.
 */
final class InstallLayout {
    static final String NATIVE_PROPERTIES = "cudabridge-native.properties";
    static final String LIBRARY_FILE = "libcudabridge_jni.so";

    private final Path directory;   // null: unknown (no code source)

    private InstallLayout(Path directory) {
        this.directory = directory;
    }

    /** The layout of files in {@code directory} (null: none is known). */
    static InstallLayout of(Path directory) {
        return new InstallLayout(directory);
    }

    /** The layout around the jar this class was loaded from. */
    static InstallLayout ofJar() {
        try {
            CodeSource cs = InstallLayout.class.getProtectionDomain().getCodeSource();
            if (cs == null || cs.getLocation() == null) {
                return new InstallLayout(null);
            }
            Path p = Paths.get(cs.getLocation().toURI());
            return new InstallLayout(Files.isDirectory(p) ? p : p.getParent());
        } catch (URISyntaxException | SecurityException | IllegalArgumentException e) {
            return new InstallLayout(null);
        }
    }

    /** {@code name} beside the jar, if that file exists; else null. */
    String besideJar(String name) {
        if (directory == null) {
            return null;
        }
        Path p = directory.resolve(name);
        return Files.isRegularFile(p) ? p.toString() : null;
    }

    /** The build's properties file, or null. */
    Path nativePropertiesFile() {
        String f = besideJar(NATIVE_PROPERTIES);
        return f == null ? null : Paths.get(f);
    }

    /** The build's properties; empty when there is no readable file (the start then says what is missing). */
    Properties nativeProperties() {
        Properties p = new Properties();
        Path file = nativePropertiesFile();
        if (file != null) {
            try (InputStream in = Files.newInputStream(file)) {
                p.load(in);
            } catch (IOException | IllegalArgumentException e) {
                p.clear();
            }
        }
        return p;
    }
}
