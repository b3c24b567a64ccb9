package org.cudabridge;

/**
 * A host wait for the task's stream passed its deadline ({@code hostWaitTimeout}): work queued
 * before the wait has not finished, and the stream may be hung. The wait changed nothing: the call
 * can be retried, or the task failed.
 *
 * <p>Python's {@code cudabridge.errors.HostWaitTimeout} (and its subclasses); {@link CudaBridgeException#of} chooses it.
 */
public class HostWaitTimeoutException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    public HostWaitTimeoutException(String message, String pythonType) {
        super(message, pythonType);
    }
}
