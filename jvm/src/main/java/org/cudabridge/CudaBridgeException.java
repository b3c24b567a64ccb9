package org.cudabridge;

/**
 * An error from the cudabridge service, carrying the Python message.
 *
 * <p>Thrown for errors the Python service reports (unknown task, stale handle, CUDA errors, a
 * failed start-up with its Python traceback). The errors task code can act on have subclasses of
 * their own: {@link KernelFaultException}, {@link DeviceUnusableException},
 * {@link HostWaitTimeoutException}, {@link UnknownTaskException}, {@link InvalidFreeException},
 * {@link FunctionFailedException} and
 * {@link GpuOutOfMemoryException}; decide by type, not by message. Bad input that Java can see by itself (negative
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

    /**
     * The exception for a Python error: the type of its kind (the errors task code can act on:
     * {@code cudabridge.jvm.errors.JAVA_KINDS}, each an {@code <kind>Exception} here), else a plain
     * {@code CudaBridgeException}. Called by the bridge library and by the control path.
     *
     * @param kind the Python class of {@code JAVA_KINDS} the error is an instance of, or null
     */
    public static CudaBridgeException of(String message, String pythonType, String kind) {
        if (kind == null) {
            return new CudaBridgeException(message, pythonType);
        }
        switch (kind) {
            case "KernelFault":
                return new KernelFaultException(message, pythonType);
            case "DeviceUnusable":
                return new DeviceUnusableException(message, pythonType);
            case "HostWaitTimeout":
                return new HostWaitTimeoutException(message, pythonType);
            case "UnknownTask":
                return new UnknownTaskException(message, pythonType);
            case "InvalidFree":
                return new InvalidFreeException(message, pythonType);
            case "FunctionFailed":
                return new FunctionFailedException(message, pythonType);
            default:   // a kind this jar does not know (a newer Python package): still the message and type
                return new CudaBridgeException(message, pythonType);
        }
    }

    /** The Python exception's qualified type name ({@code "startup"} for a failed start,
     *  {@code "java"} for an error raised on the Java side). */
    public String getPythonType() {
        return pythonType;
    }
}
