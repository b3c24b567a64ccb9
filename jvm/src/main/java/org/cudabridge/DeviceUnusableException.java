package org.cudabridge;

/**
 * The GPU's CUDA context is unusable after a sticky error. Nothing more can run on it in this
 * process: the task fails, and the plugin has the executor replaced (docs/spark-plugin.md).
 *
 * <p>Python's {@code cudabridge.errors.DeviceUnusable} (and its subclasses); {@link CudaBridgeException#of} chooses it.
 */
public class DeviceUnusableException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    public DeviceUnusableException(String message, String pythonType) {
        super(message, pythonType);
    }
}
