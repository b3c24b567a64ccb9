package org.cudabridge;

/**
 * A free of something that is not a live allocation of the pool: a handle freed already, or one
 * the service never handed out.
 *
 * <p>Python's {@code cudabridge.errors.InvalidFree} (and its subclasses); {@link CudaBridgeException#of} chooses it.
 */
public class InvalidFreeException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    public InvalidFreeException(String message, String pythonType) {
        super(message, pythonType);
    }
}
