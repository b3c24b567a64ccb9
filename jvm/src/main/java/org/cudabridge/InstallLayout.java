package org.cudabridge;

import java.io.IOException;
import java.io.InputStream;
import java.net.URISyntaxException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.CodeSource;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;

/**
 * A directory that may hold the bridge's native part: the Python package's {@code _native}
 * directory, with the bridge library and the {@code cudabridge-native.properties} the build wrote
 * (what the library was built against, its size and SHA-256). Nothing in it names an absolute
 * place: the package's directory and its environment's interpreter are read off where the
 * directory is, so an installed package can move (a packed environment unpacked on an executor).
 *
 * <p>Where it is looked for ({@link BridgeOptions#resolved}): beside the jar the bridge's classes
 * came from (an installed package or a source tree keep the jars, the library and the properties
 * in one directory); else in the configured Python's environment
 * ({@code <prefix>/lib/python3.N/site-packages/cudabridge/_native}), where it is when the jars came
 * through Spark's {@code --jars} (copied into the executor's directory) and the environment with
 * {@code --archives}.
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

    /**
     * The package's {@code _native} directory in the environment of {@code python} (a path to an
     * interpreter in {@code <prefix>/bin}; symbolic links are not followed, as a virtual
     * environment's {@code bin/python} links to its base interpreter), if one there holds the
     * library; else a layout with no directory.
     */
    static InstallLayout ofPython(String python) {
        if (python == null || python.indexOf('/') < 0) {
            return new InstallLayout(null);
        }
        Path bin = Paths.get(python).toAbsolutePath().normalize().getParent();
        Path prefix = bin == null ? null : bin.getParent();
        if (prefix == null || !Files.isDirectory(prefix.resolve("lib"))) {
            return new InstallLayout(null);
        }
        List<Path> found = new ArrayList<>();
        try (DirectoryStream<Path> libs = Files.newDirectoryStream(prefix.resolve("lib"), "python3*")) {
            for (Path lib : libs) {
                Path dir = lib.resolve("site-packages").resolve("cudabridge").resolve("_native");
                if (Files.isRegularFile(dir.resolve(LIBRARY_FILE))) {
                    found.add(dir);
                }
            }
        } catch (IOException | SecurityException e) {
            return new InstallLayout(null);
        }
        Collections.sort(found);
        return new InstallLayout(found.isEmpty() ? null : found.get(0));
    }

    /** {@code name} in this directory, if that file exists; else null. */
    String file(String name) {
        if (directory == null) {
            return null;
        }
        Path p = directory.resolve(name);
        return Files.isRegularFile(p) ? p.toString() : null;
    }

    /** The bridge library in this directory, or null. */
    String library() {
        return file(LIBRARY_FILE);
    }

    /** The build's properties file, or null. */
    Path nativePropertiesFile() {
        String f = file(NATIVE_PROPERTIES);
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

    /** The directory holding the {@code cudabridge} package this directory belongs to (its
     *  {@code _native}'s grandparent), or null when this is not a package's {@code _native}. */
    String packageParent() {
        Path pkg = directory == null ? null : directory.toAbsolutePath().normalize().getParent();
        if (pkg == null || !"_native".equals(String.valueOf(directory.toAbsolutePath().normalize().getFileName()))
                || !"cudabridge".equals(String.valueOf(pkg.getFileName())) || pkg.getParent() == null) {
            return null;
        }
        return pkg.getParent().toString();
    }

    /** The interpreter of the environment this package is installed in
     *  ({@code <prefix>/lib/python3.N/site-packages/cudabridge/_native} gives
     *  {@code <prefix>/bin/python}, {@code python3} or {@code python3.N}, the first that exists),
     *  or null (a source tree, or no such interpreter). */
    String environmentPython() {
        String parent = packageParent();
        if (parent == null) {
            return null;
        }
        Path sitePackages = Paths.get(parent);
        Path lib = sitePackages.getParent();
        if (!"site-packages".equals(String.valueOf(sitePackages.getFileName())) || lib == null
                || lib.getParent() == null || !String.valueOf(lib.getFileName()).startsWith("python3")) {
            return null;
        }
        Path bin = lib.getParent().getParent() == null ? null : lib.getParent().getParent().resolve("bin");
        if (bin == null) {
            return null;
        }
        for (String name : new String[] {"python", "python3", String.valueOf(lib.getFileName())}) {
            Path p = bin.resolve(name);
            if (Files.isRegularFile(p) && Files.isExecutable(p)) {
                return p.toString();
            }
        }
        return null;
    }
}
