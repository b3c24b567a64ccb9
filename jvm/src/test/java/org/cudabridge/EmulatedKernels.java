package org.cudabridge;

import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * On a {@link RunningBridge} test class: its bridge starts with the repository's {@code tests/} on
 * the Python path (dev/junit runs in the repository root) and {@code emulatedKernels} set to this
 * module of host kernels, so that its kernels run on the emulated device.
 */
@Retention(RetentionPolicy.RUNTIME)
@Target(ElementType.TYPE)
@interface EmulatedKernels {
    /** The module of host kernels in tests/, e.g. {@code host_kernels_for_tests}. */
    String value();
}
