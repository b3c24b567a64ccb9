package org.cudabridge;

/**
 * A Python function called from Java ({@link PythonFunction#call}) raised. {@link #getPythonType()}
 * is the type it raised (for example {@code builtins.ZeroDivisionError} reads {@code ZeroDivisionError}),
 * {@link #pythonTraceback()} its traceback. Errors of the service itself raised inside the function
 * (out of device memory, its task being released) arrive as their own types instead
 * ({@link GpuOutOfMemoryException}, {@link UnknownTaskException}). The executor goes on working:
 * nothing of the call is left behind.
 */
public class FunctionFailedException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    /** @param message {@code "<function>: <type>: <text>"}, then the traceback on the lines after it */
    public FunctionFailedException(String message, String pythonType) {
        super(message, pythonType);
    }

    /** The Python traceback ({@code "Traceback (most recent call last): ..."}), or "" if there is none. */
    public String pythonTraceback() {
        String m = getMessage();
        int nl = m == null ? -1 : m.indexOf('\n');
        return nl < 0 ? "" : m.substring(nl + 1);
    }
}
