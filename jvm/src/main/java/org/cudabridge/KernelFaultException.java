package org.cudabridge;

/**
 * A kernel faulted on the task's stream (a sticky CUDA error, such as an illegal address or a trap),
 * found by a synchronize. The message names the kernels launched on that stream since its last
 * completed synchronize, one of which faulted. The GPU's context is unusable from then on: later
 * calls on it fail with {@link DeviceUnusableException}, and the executor is replaced.
 *
 * <p>Python's {@code cudabridge.errors.KernelFault} (and its subclasses); {@link CudaBridgeException#of} chooses it.
 */
public class KernelFaultException extends CudaBridgeException {
    private static final long serialVersionUID = 1L;

    public KernelFaultException(String message, String pythonType) {
        super(message, pythonType);
    }
}
