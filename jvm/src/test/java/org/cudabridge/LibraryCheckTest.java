package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.OutputStream;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.Properties;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The library check on copies of the real bridge library (dev/junit passes its path as
 * {@code -Dcudabridge.library}), whole, truncated, changed, or with one ELF header field patched.
 */
class LibraryCheckTest {
    private static final String NAME = "libcudabridge_jni.so";
    private static final String PROPERTIES = "cudabridge-native.properties";
    private static final String REBUILD = "rebuild with `python -m cudabridge build`";

    @TempDir
    Path dir;

    private Path lib;       // a copy of the real library, in dir
    private long size;
    private String sha;

    @BeforeEach
    void copyTheRealLibrary() throws IOException {
        String built = System.getProperty(SettingsTable.LIBRARY_PROPERTY.key());
        assertNotNull(built, "-D" + SettingsTable.LIBRARY_PROPERTY.key()
                + " is not set: run the Java unit tests with dev/junit");
        lib = dir.resolve(NAME);
        Files.copy(Paths.get(built), lib);
        size = Files.size(lib);
        sha = sha256(lib);
    }

    private static String sha256(Path file) throws IOException {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(Files.readAllBytes(file)));
        } catch (NoSuchAlgorithmException e) {
            throw new AssertionError(e);
        }
    }

    private static Properties built(Path library, long size, String sha) {
        Properties p = new Properties();
        p.setProperty(LibraryCheck.FILE_KEY, library.getFileName().toString());
        p.setProperty(LibraryCheck.SIZE_KEY, Long.toString(size));
        p.setProperty(LibraryCheck.SHA256_KEY, sha);
        return p;
    }

    private LibraryCheck.Recorded recordedAsBuilt() {
        return new LibraryCheck.Recorded(built(lib, size, sha), dir.resolve(PROPERTIES));
    }

    /** The check's message for {@code library}; fails the test where the check passes. */
    private static String refusal(Path library, LibraryCheck.Recorded recorded) {
        CudaBridgeException e = assertThrows(CudaBridgeException.class, () -> LibraryCheck.verify(library, recorded),
                library + " passed the check");
        assertEquals("java", e.getPythonType());
        assertTrue(e.getMessage().startsWith("cudabridge: "), e.getMessage());
        assertContains(library.getFileName() + " at " + library, e.getMessage()); // names the file
        return e.getMessage();
    }

    private static void assertContains(String expected, String actual) {
        assertTrue(actual.contains(expected), "expected <" + expected + "> in <" + actual + ">");
    }

    private void truncate(long to) throws IOException {
        try (RandomAccessFile f = new RandomAccessFile(lib.toFile(), "rw")) {
            f.setLength(to);
        }
    }

    /** Writes {@code bytes} at {@code offset} of the copy. */
    private void patch(long offset, byte... bytes) throws IOException {
        try (RandomAccessFile f = new RandomAccessFile(lib.toFile(), "rw")) {
            f.seek(offset);
            f.write(bytes);
        }
    }

    private void patchShort(long offset, int value) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(2).order(ByteOrder.nativeOrder());
        b.putShort((short) value);
        patch(offset, b.array());
    }

    private ByteBuffer header() throws IOException {
        byte[] all = Files.readAllBytes(lib);
        return ByteBuffer.wrap(all, 0, 64).order(ByteOrder.nativeOrder());
    }

    // --- a sound library ------------------------------------------------------------------------------

    @Test
    void builtLibraryPassesWithItsRecordedSizeAndHash() {
        assertDoesNotThrow(() -> LibraryCheck.verify(lib, recordedAsBuilt()));
        // the hash is compared without regard to case
        LibraryCheck.Recorded upper = new LibraryCheck.Recorded(built(lib, size, sha.toUpperCase()), dir.resolve(PROPERTIES));
        assertDoesNotThrow(() -> LibraryCheck.verify(lib, upper));
    }

    @Test
    void builtLibraryPassesWithNothingRecorded() {
        assertDoesNotThrow(() -> LibraryCheck.verify(lib, null));
    }

    // --- truncated --------------------------------------------------------------------------------------

    @Test
    void truncatedLibraryIsRefusedByTheRecordedSize() throws IOException {
        truncate(size / 2);
        String m = refusal(lib, recordedAsBuilt());
        assertContains(" is " + size / 2 + " bytes, the build recorded " + size + ": " + REBUILD, m);
        assertContains("(recorded in " + dir.resolve(PROPERTIES) + "; loading it could crash the JVM)", m);
    }

    @Test
    void truncatedLibraryIsRefusedByItsElfLayoutWhereNothingIsRecorded() throws IOException {
        ByteBuffer h = header();
        long shEnd = h.getLong(40) + (long) (h.getShort(60) & 0xffff) * (h.getShort(58) & 0xffff);
        assertTrue(shEnd > 64 && shEnd <= size, "section header table ends at " + shEnd + " of " + size);
        truncate(shEnd - 1); // one byte short of the last section header
        assertContains(" is " + (shEnd - 1) + " bytes, but its ELF section header table reaches byte " + shEnd
                + ": the file is truncated; " + REBUILD, refusal(lib, null));
    }

    @Test
    void libraryCutInsideItsSegmentsIsRefusedByItsProgramHeaders() throws IOException {
        ByteBuffer h = header();
        long phEnd = h.getLong(32) + (long) (h.getShort(56) & 0xffff) * (h.getShort(54) & 0xffff);
        truncate(phEnd); // the program headers are all there, the segments they name are not
        String m = refusal(lib, null);
        assertContains(" is " + phEnd + " bytes, but its ELF program header ", m);
        assertContains("the file is truncated", m);
    }

    @Test
    void fileShorterThanAnElfHeaderIsRefused() throws IOException {
        truncate(40);
        assertContains(" is 40 bytes, too short for an ELF header: " + REBUILD, refusal(lib, null));
    }

    // --- changed after the build --------------------------------------------------------------------------

    @Test
    void changedByteIsRefusedByTheRecordedHash() throws IOException {
        byte[] one = new byte[1];
        try (RandomAccessFile f = new RandomAccessFile(lib.toFile(), "rw")) {
            f.seek(size / 2);
            one[0] = (byte) (f.readByte() ^ 0x5a);
        }
        patch(size / 2, one);
        assertEquals(size, Files.size(lib));
        String now = sha256(lib);
        String m = refusal(lib, recordedAsBuilt());
        assertContains(" has SHA-256 " + now + ", the build recorded " + sha + ": the file changed after its build; "
                + REBUILD, m);
        // the same file passes where nothing is recorded: its ELF layout is still sound
        assertDoesNotThrow(() -> LibraryCheck.verify(lib, null));
    }

    @Test
    void wrongRecordedHashIsRefused() {
        String zeros = "0".repeat(64);
        LibraryCheck.Recorded wrong = new LibraryCheck.Recorded(built(lib, size, zeros), dir.resolve(PROPERTIES));
        assertContains(" has SHA-256 " + sha + ", the build recorded " + zeros, refusal(lib, wrong));
    }

    // --- not a library for this JVM -------------------------------------------------------------------------

    @Test
    void nonElfFileIsRefusedEvenWhereItsSizeAndHashAreRecorded() throws IOException {
        Path text = dir.resolve("other").resolve(NAME);
        Files.createDirectories(text.getParent());
        try (OutputStream out = Files.newOutputStream(text)) {
            out.write("#!/bin/sh\necho this is not a library\n".repeat(4).getBytes(StandardCharsets.US_ASCII));
        }
        LibraryCheck.Recorded recorded = new LibraryCheck.Recorded(built(text, Files.size(text), sha256(text)),
                text.resolveSibling(PROPERTIES));
        assertContains(" is not an ELF file (it starts with 23 21 2f 62): " + REBUILD, refusal(text, recorded));
    }

    @Test
    void thirtyTwoBitLibraryIsRefused() throws IOException {
        patch(4, (byte) 1); // EI_CLASS: ELFCLASS32
        assertContains(" is a 32-bit ELF file; this JVM needs a 64-bit library", refusal(lib, null));
    }

    @Test
    void otherByteOrderIsRefused() throws IOException {
        boolean little = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;
        patch(5, (byte) (little ? 2 : 1)); // EI_DATA
        assertContains(" is ELF with byte order " + (little ? "BIG_ENDIAN" : "LITTLE_ENDIAN") + ", this JVM runs "
                + ByteOrder.nativeOrder(), refusal(lib, null));
    }

    @Test
    void executableIsNotASharedObject() throws IOException {
        patchShort(16, 2); // e_type: ET_EXEC
        assertContains(" is an ELF file of type 2, not a shared object (ET_DYN)", refusal(lib, null));
    }

    @Test
    void libraryForAnotherMachineIsRefused() throws IOException {
        int machine = header().getShort(18) & 0xffff;
        int other = machine == 40 ? 3 : 40; // ARM, or i386 where this is ARM
        patchShort(18, other);
        assertContains(" is built for ELF machine " + other + " (" + (other == 40 ? "ARM" : "i386")
                + "), but this JVM runs on " + System.getProperty("os.arch"), refusal(lib, null));
    }

    @Test
    void missingFileIsRefused() {
        Path missing = dir.resolve("gone").resolve(NAME);
        assertContains(": cannot read " + NAME + " at " + missing + ": java.nio.file.NoSuchFileException",
                refusal(missing, null));
    }

    // --- where the recorded size and hash come from -----------------------------------------------------------

    private void writeProperties(Path file, Properties p) throws IOException {
        try (OutputStream out = Files.newOutputStream(file)) {
            p.store(out, null);
        }
    }

    @Test
    void aLibraryBuiltAgainstALibpythonThatIsNotHereIsRefusedWithTheRebuild() {
        Properties p = built(lib, size, sha);
        p.setProperty(LibraryCheck.LIBPYTHON_KEY, dir.resolve("elsewhere/libpython3.11.so.1.0").toString());
        String msg = refusal(lib, new LibraryCheck.Recorded(p, dir.resolve(PROPERTIES)));
        assertTrue(msg.contains("was built against " + dir.resolve("elsewhere/libpython3.11.so.1.0")), msg);
        assertTrue(msg.contains("-m cudabridge build --native-only"), msg);
    }

    @Test
    void aRecordedLibpythonThatIsHerePasses() throws IOException {
        Path libpython = Files.writeString(dir.resolve("libpython3.11.so.1.0"), "x");
        Properties p = built(lib, size, sha);
        p.setProperty(LibraryCheck.LIBPYTHON_KEY, libpython.toString());
        LibraryCheck.verify(lib, new LibraryCheck.Recorded(p, dir.resolve(PROPERTIES)));
    }

    @Test
    void propertiesBesideTheLibraryNamingItsFileNameAreUsed() throws IOException {
        // written where the library was built: a copy with its properties (an installed or an
        // unpacked environment) stays checkable
        Path beside = dir.resolve(PROPERTIES);
        writeProperties(beside, built(Paths.get("/where/it/was/built", NAME), size, sha));
        LibraryCheck.Recorded r = LibraryCheck.recordedFor(lib);
        assertNotNull(r);
        assertEquals(beside, r.file);
        assertEquals(Long.toString(size), r.props.getProperty(LibraryCheck.SIZE_KEY));
    }

    @Test
    void propertiesBesideNamingAnotherFileAreNotUsed() throws IOException {
        writeProperties(dir.resolve(PROPERTIES), built(Paths.get("/elsewhere/libother.so"), size, sha));
        assertNull(LibraryCheck.recordedFor(lib));
    }

    @Test
    void propertiesNamingNoFileAreNotUsed() throws IOException {
        Properties p = built(lib, size, sha);
        p.remove(LibraryCheck.FILE_KEY);   // an older build's properties, which named absolute paths
        writeProperties(dir.resolve(PROPERTIES), p);
        assertNull(LibraryCheck.recordedFor(lib));
    }

    @Test
    void noPropertiesBesideTheLibraryRecordNothing() {
        assertNull(LibraryCheck.recordedFor(lib));
    }
}
