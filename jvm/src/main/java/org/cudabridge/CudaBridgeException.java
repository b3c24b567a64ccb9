package org.cudabridge;

/**
 * An error from the cudabridge service, carrying the Python message.
 *
 * <p>Thrown for errors the Python service reports (unknown task, stale handle, CUDA errors, a
 * failed start-up with its Python traceback). Bad input that Java can see by itself (negative
 * sizes, ranges outside a buffer, null arrays, use after close, no bound task) gets the standard
 * Java exceptions instead ({@link IllegalArgumentException}, {@link IndexOutOfBoundsException},
 * {@link NullPointerException}, {@link IllegalStateException}), thrown before anything changes.
 */
public class CudaBridgeException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final String pythonType;

    /** @param message the Python message, as {@code "<TypeName>: <str(exc)>"}
     *  @param pythonType the Python exception's qualified type, e.g. {@code cudabridge.errors.InvalidFree} */
    public CudaBridgeException(String message, String pythonType) {
        super(message);
        this.pythonType = pythonType;
    }

    public CudaBridgeException(String message, String pythonType, Throwable cause) {
        super(message, cause);
        this.pythonType = pythonType;
    }

    /** The Python exception's qualified type name ({@code "startup"} for a failed start,
     *  {@code "java"} for an error raised on the Java side). */
    public String getPythonType() {
        return pythonType;
    }
}
