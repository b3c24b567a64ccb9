package org.cudabridge.harness;

import java.io.File;
import java.lang.reflect.Method;
import java.net.URL;
import java.net.URLClassLoader;

/**
 * Starts the bridge with its jar in a child class loader, as Spark's {@code --jars} gives it:
 * {@code java -cp <harness classes only> ChildLoaderStart <cudabridge.jar> <python>}. Neither the
 * jar nor JPype's org.jpype.jar is on the system class path; the bridge must put JPype's jar on
 * the system class loader itself and find its own classes through the child loader. Touches no
 * org.cudabridge class directly (that would load it through the system class loader).
 */
public final class ChildLoaderStart {
    private ChildLoaderStart() {}

    public static void main(String[] args) throws Exception {
        URLClassLoader child = new URLClassLoader(new URL[] {new File(args[0]).toURI().toURL()},
                ClassLoader.getSystemClassLoader());
        Class<?> optionsClass = Class.forName("org.cudabridge.BridgeOptions", true, child);
        Object options = optionsClass.getConstructor().newInstance();
        optionsClass.getMethod("python", String.class).invoke(options, args[1]);
        optionsClass.getMethod("set", String.class, String.class).invoke(options, "backend", "emulated");
        Class<?> bridgeClass = Class.forName("org.cudabridge.CudaBridge", true, child);
        Object bridge = bridgeClass.getMethod("start", optionsClass).invoke(null, options);
        Method bind = bridgeClass.getMethod("bindTask", long.class);
        try (AutoCloseable task = (AutoCloseable) bind.invoke(bridge, 7L)) {
            System.out.println("RESULT stream=" + bridgeClass.getMethod("stream").invoke(bridge));
            try (AutoCloseable buffer = (AutoCloseable) bridgeClass.getMethod("allocate", long.class)
                    .invoke(bridge, 4096L)) {
                System.out.println("RESULT allocated=true");
            }
        }
        // the control plane (a JPype proxy of a child-loaded interface) answers
        Object stats = bridgeClass.getMethod("statistics").invoke(bridge);
        System.out.println("RESULT statistics=" + (stats != null));
        System.out.println("RESULT bridge_loader_is_child=" + (bridgeClass.getClassLoader() == child));
        System.out.println("RESULT jpype_on_system=" + (Class.forName("org.jpype.JPypeContext", false,
                ClassLoader.getSystemClassLoader()) != null));
    }
}
