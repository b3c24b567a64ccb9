package org.cudabridge;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Locale;
import java.util.Properties;

/**
 * Checks the bridge library before {@code System.load}: a damaged file must give a
 * {@link CudaBridgeException} that {@link CudaBridge#tryStart} can record, not a JVM killed by
 * SIGBUS inside the dynamic loader (which maps the segments its program headers name, and a
 * truncated file ends before them).
 *
 * <ul>
 *   <li>Where the build recorded the library ({@code library.size}, {@code library.sha256} in
 *       the {@code cudabridge-native.properties} beside it, or beside the jar when that file
 *       names this very library): its size, then its SHA-256.</li>
 *   <li>Always, so also for a library given with {@code -Dcudabridge.library} and nothing
 *       recorded: the ELF header (magic, 64-bit, this JVM's byte order, a shared object, this
 *       JVM's machine) and that every program header's bytes, and the section header table, lie
 *       within the file.</li>
 * </ul>
 * Costs one read of the file (about 200 KB) per JVM start.
 */
final class LibraryCheck {
    static final String FILE_KEY = "library.file";
    static final String SIZE_KEY = "library.size";
    static final String SHA256_KEY = "library.sha256";
    static final String LIBPYTHON_KEY = "libpython";
    private static final String REBUILD = "rebuild with `python -m cudabridge build` (`--native-only` where there "
            + "is no javac)";

    private static final int EM_X86_64 = 62;
    private static final int EM_AARCH64 = 183;
    private static final int EM_PPC64 = 21;
    private static final int EM_S390 = 22;
    private static final int EM_RISCV = 243;
    private static final int EM_LOONGARCH = 258;

    private LibraryCheck() {}

    /** What the build recorded for {@code library}: the properties beside it, if they describe a
     *  library of its file name ({@code library.file}: a copied build stays checkable), else null. */
    static Recorded recordedFor(Path library) {
        Path dir = library.toAbsolutePath().getParent();
        if (dir != null) {
            Path beside = dir.resolve(InstallLayout.NATIVE_PROPERTIES);
            Properties p = load(beside);
            if (p != null && library.getFileName().toString().equals(p.getProperty(FILE_KEY))) {
                return new Recorded(p, beside);
            }
        }
        return null;
    }

    /** Throws {@link CudaBridgeException} saying what is wrong with the file, if anything. */
    static void verify(Path library, Recorded recorded) {
        String name = library.getFileName().toString();
        String where = name + " at " + library;
        long size;
        try {
            size = Files.size(library);
        } catch (IOException e) {
            throw fail("cudabridge: cannot read " + where + ": " + e, e);
        }
        if (recorded != null) {
            String recordedSize = recorded.props.getProperty(SIZE_KEY);
            if (recordedSize != null && !recordedSize.trim().equals(Long.toString(size))) {
                throw fail("cudabridge: " + where + " is " + size + " bytes, the build recorded " + recordedSize.trim()
                        + ": " + REBUILD + " (recorded in " + recorded.file + "; loading it could crash the JVM)", null);
            }
            String recordedSha = recorded.props.getProperty(SHA256_KEY);
            if (recordedSha != null) {
                String sha = sha256(library, where);
                if (!sha.equalsIgnoreCase(recordedSha.trim())) {
                    throw fail("cudabridge: " + where + " has SHA-256 " + sha + ", the build recorded " + recordedSha.trim()
                            + ": the file changed after its build; " + REBUILD + " (recorded in " + recorded.file + ")",
                            null);
                }
            }
            // The library links this libpython by its path on the build machine: a wheel installed
            // where that Python is not (another path, another machine) cannot load.
            String libpython = recorded.props.getProperty(LIBPYTHON_KEY);
            if (libpython != null && !Files.isRegularFile(Paths.get(libpython.trim()))) {
                throw fail("cudabridge: " + where + " was built against " + libpython.trim() + ", which is not here: "
                        + "rebuild it for this machine's Python with `<that python> -m cudabridge build --native-only` "
                        + "(needs gcc and a JDK's include/jni.h; recorded in " + recorded.file + ")", null);
            }
        }
        checkElf(library, where, size);
    }

    private static void checkElf(Path library, String where, long size) {
        ByteBuffer h = ByteBuffer.allocate(64);
        try (FileChannel ch = FileChannel.open(library, StandardOpenOption.READ)) {
            readFully(ch, h, 0);
            if (h.position() < 64) {
                throw fail("cudabridge: " + where + " is " + size + " bytes, too short for an ELF header: " + REBUILD, null);
            }
            h.flip();
            if (h.get(0) != 0x7f || h.get(1) != 'E' || h.get(2) != 'L' || h.get(3) != 'F') {
                throw fail("cudabridge: " + where + " is not an ELF file (it starts with " + hex(h, 4) + "): " + REBUILD,
                        null);
            }
            if (h.get(4) != 2) {
                throw fail("cudabridge: " + where + " is a " + (h.get(4) == 1 ? "32-bit" : "class " + h.get(4))
                        + " ELF file; this JVM needs a 64-bit library: " + REBUILD + " with a 64-bit toolchain", null);
            }
            ByteOrder order = h.get(5) == 1 ? ByteOrder.LITTLE_ENDIAN : h.get(5) == 2 ? ByteOrder.BIG_ENDIAN : null;
            if (order != ByteOrder.nativeOrder()) {
                throw fail("cudabridge: " + where + " is ELF with byte order " + (order == null ? "code " + h.get(5) : order)
                        + ", this JVM runs " + ByteOrder.nativeOrder() + ": " + REBUILD + " on this machine", null);
            }
            h.order(order);
            int type = h.getShort(16) & 0xffff;
            if (type != 3) { // ET_DYN
                throw fail("cudabridge: " + where + " is an ELF file of type " + type + ", not a shared object (ET_DYN): "
                        + REBUILD, null);
            }
            int machine = h.getShort(18) & 0xffff;
            String arch = System.getProperty("os.arch", "?");
            int want = machineOf(arch);
            if (want >= 0 && machine != want) {
                throw fail("cudabridge: " + where + " is built for ELF machine " + machine + " (" + machineName(machine)
                        + "), but this JVM runs on " + arch + " (" + machineName(want) + ", machine " + want + "): "
                        + REBUILD + " on this machine", null);
            }
            long phoff = h.getLong(32);
            long shoff = h.getLong(40);
            int phentsize = h.getShort(54) & 0xffff;
            int phnum = h.getShort(56) & 0xffff;
            int shentsize = h.getShort(58) & 0xffff;
            int shnum = h.getShort(60) & 0xffff;
            if (phnum == 0 || phentsize < 56) {
                throw fail("cudabridge: " + where + " has no usable ELF program headers (" + phnum + " of " + phentsize
                        + " bytes): " + REBUILD, null);
            }
            long phEnd = phoff + (long) phnum * phentsize;
            if (phoff < 0 || phEnd > size) {
                throw truncated(where, size, "its ELF program header table", phEnd);
            }
            ByteBuffer ph = ByteBuffer.allocate(phnum * phentsize).order(order);
            readFully(ch, ph, phoff);
            for (int i = 0; i < phnum; i++) {
                int base = i * phentsize;
                int ptype = ph.getInt(base);
                long offset = ph.getLong(base + 8);
                long filesz = ph.getLong(base + 32);
                if (offset < 0 || filesz < 0 || offset + filesz > size || offset + filesz < 0) {
                    throw truncated(where, size, "its ELF program header " + i + " (" + segmentName(ptype) + ")",
                            offset + filesz);
                }
            }
            if (shnum > 0) {
                long shEnd = shoff + (long) shnum * shentsize;
                if (shoff < 0 || shEnd > size) {
                    throw truncated(where, size, "its ELF section header table", shEnd);
                }
            }
        } catch (IOException e) {
            throw fail("cudabridge: cannot read " + where + ": " + e, e);
        }
    }

    private static CudaBridgeException truncated(String where, long size, String what, long end) {
        return fail("cudabridge: " + where + " is " + size + " bytes, but " + what + " reaches byte " + end
                + ": the file is truncated; " + REBUILD, null);
    }

    private static void readFully(FileChannel ch, ByteBuffer b, long at) throws IOException {
        long pos = at;
        while (b.hasRemaining()) {
            int n = ch.read(b, pos);
            if (n < 0) {
                return;
            }
            pos += n;
        }
    }

    private static String sha256(Path file, String where) {
        MessageDigest md;
        try {
            md = MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw fail("cudabridge: no SHA-256 in this JVM to check " + where, e);
        }
        byte[] buf = new byte[1 << 16];
        try (InputStream in = Files.newInputStream(file)) {
            for (int n; (n = in.read(buf)) > 0; ) {
                md.update(buf, 0, n);
            }
        } catch (IOException e) {
            throw fail("cudabridge: cannot read " + where + ": " + e, e);
        }
        StringBuilder sb = new StringBuilder(64);
        for (byte x : md.digest()) {
            sb.append(String.format("%02x", x & 0xff));
        }
        return sb.toString();
    }

    private static String hex(ByteBuffer b, int n) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < n && i < b.limit(); i++) {
            sb.append(i == 0 ? "" : " ").append(String.format("%02x", b.get(i) & 0xff));
        }
        return sb.toString();
    }

    private static int machineOf(String osArch) {
        switch (osArch.toLowerCase(Locale.ROOT)) {
            case "amd64": case "x86_64": return EM_X86_64;
            case "aarch64": case "arm64": return EM_AARCH64;
            case "ppc64": case "ppc64le": return EM_PPC64;
            case "s390x": return EM_S390;
            case "riscv64": return EM_RISCV;
            case "loongarch64": return EM_LOONGARCH;
            default: return -1; // unknown here: not checked
        }
    }

    private static String machineName(int machine) {
        switch (machine) {
            case 3: return "i386";
            case 40: return "ARM";
            case EM_X86_64: return "x86-64";
            case EM_AARCH64: return "AArch64";
            case EM_PPC64: return "PowerPC64";
            case EM_S390: return "S/390";
            case EM_RISCV: return "RISC-V";
            case EM_LOONGARCH: return "LoongArch";
            default: return "machine " + machine;
        }
    }

    private static String segmentName(int type) {
        switch (type) {
            case 1: return "PT_LOAD";
            case 2: return "PT_DYNAMIC";
            case 3: return "PT_INTERP";
            case 4: return "PT_NOTE";
            default: return String.format("type 0x%x", type);
        }
    }

    private static Properties load(Path file) {
        if (!Files.isRegularFile(file)) {
            return null;
        }
        Properties p = new Properties();
        try (InputStream in = Files.newInputStream(file)) {
            p.load(in);
            return p;
        } catch (IOException | IllegalArgumentException e) {
            return null;
        }
    }

    private static CudaBridgeException fail(String message, Throwable cause) {
        return cause == null ? new CudaBridgeException(message, "java") : new CudaBridgeException(message, "java", cause);
    }

    /** A build's properties and where they were read from. */
    static final class Recorded {
        final Properties props;
        final Path file;

        Recorded(Properties props, Path file) {
            this.props = props;
            this.file = file;
        }
    }
}
