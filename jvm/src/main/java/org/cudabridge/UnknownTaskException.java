package org.cudabridge;

/**
 * A task attempt id that is not bound in the service: the task was released already, or was never
 * bound (no {@link TaskScope}).
 *
 * <p>Python's {@code cudabridge.errors.UnknownTask} (and its subclasses); {@link CudaBridgeException#of} chooses it.
 */
public class UnknownTaskException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    public UnknownTaskException(String message, String pythonType) {
        super(message, pythonType);
    }
}
