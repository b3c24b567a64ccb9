package org.cudabridge;

import java.io.File;
import java.nio.file.Paths;
import java.util.Objects;

/**
 * Starts the bridge, once per JVM, and remembers how: the running bridge, or why its last start
 * failed. {@link CudaBridge}'s static entry points are this class's.
 *
 * <p>Invariant: at most one of {@code instance} and {@code failure} is non-null after a start
 * returned; both change only under {@code START_LOCK}. A bridge that was shut down stays the
 * instance (its calls say so): Python cannot start twice in a JVM.
 */
final class Launcher {
    private static final Object START_LOCK = new Object();
    private static volatile CudaBridge instance;
    private static volatile CudaBridgeException failure;

    private Launcher() {}

    static CudaBridge start(BridgeOptions options) {
        Objects.requireNonNull(options, "options");
        CudaBridge running = instance;
        if (running != null) {
            running.checkRunning("start");
            return running;
        }
        synchronized (START_LOCK) {
            if (instance != null) {
                instance.checkRunning("start");
                return instance;
            }
            try {
                CudaBridge b = launch(options.resolved(InstallLayout.ofJar()));
                failure = null;
                instance = b;
                return b;
            } catch (CudaBridgeException e) {
                failure = e;
                throw e;
            } catch (RuntimeException | LinkageError e) {
                CudaBridgeException wrapped = new CudaBridgeException("cudabridge start failed: " + e, "java", e);
                failure = wrapped;
                throw wrapped;
            }
        }
    }

    static boolean tryStart(BridgeOptions options) {
        try {
            start(options);
            return true;
        } catch (Throwable t) { // a plugin's init must never throw (Spark relaunches executors forever)
            synchronized (START_LOCK) {
                if (failure == null) {
                    failure = new CudaBridgeException("cudabridge start failed: " + t, "java", t);
                }
            }
            return false;
        }
    }

    static CudaBridgeException failure() {
        return failure;
    }

    static CudaBridge instance() {
        return instance;
    }

    /** Serializes a shutdown with starts (a start never sees a bridge half shut down). */
    static Object lock() {
        return START_LOCK;
    }

    static CudaBridge get() {
        CudaBridge b = instance;
        if (b != null) {
            b.checkRunning("CudaBridge.get");
            return b;
        }
        CudaBridgeException f = failure;
        if (f != null) {
            throw new CudaBridgeException("cudabridge is not available: its start failed: " + f.getMessage(),
                    f.getPythonType(), f);
        }
        throw new IllegalStateException("cudabridge is not started in this JVM: call CudaBridge.start first "
                + "(the Spark plugin does it in ExecutorPlugin.init)");
    }

    private static CudaBridge launch(BridgeOptions o) {
        try {
            // Before anything is loaded, without Python: a misspelled key or CUDABRIDGE_* variable,
            // a bad value or a pinned pool that cannot hold a staging ring fails here. The Python
            // service reads this process's CUDABRIDGE_* variables under the keys given here
            // (cudabridge.config.ServiceConfig): checked as it will use them.
            Settings.checkAll(o.conf(), System.getenv());
        } catch (IllegalArgumentException e) {
            throw new CudaBridgeException("cudabridge: " + e.getMessage(), "java", e);
        }
        if (o.library() == null) {
            throw new CudaBridgeException("cudabridge: the bridge library was not found beside cudabridge.jar nor in "
                    + "the Python environment of " + (o.python() == null ? "the (unset) cudabridge.python" : o.python())
                    + ": install the spark-cuda-bridge wheel in that environment, or name the library with "
                    + "spark.cudabridge.library (-D" + SettingsTable.LIBRARY_PROPERTY.key() + " outside Spark)", "java");
        }
        if (!new File(o.library()).isFile()) {
            throw new CudaBridgeException("cudabridge: no bridge library at " + o.library() + " (build it with "
                    + "`python -m cudabridge build`, or set -D" + SettingsTable.LIBRARY_PROPERTY.key() + ")", "java");
        }
        if (o.python() == null) {
            throw new CudaBridgeException("cudabridge: no Python given: set -D" + SettingsTable.PYTHON_PROPERTY.key()
                    + "=<venv>/bin/python or " + BridgeOptions.PYTHON_ENV + ", or BridgeOptions.python", "java");
        }
        String library = new File(o.library()).getAbsolutePath();
        // Checked before System.load (a truncated library crashes the JVM in the dynamic loader);
        // the Python executable is checked by the library, before Python starts.
        NativeBridge.load(library, LibraryCheck.recordedFor(Paths.get(library)));
        // Python looks the bridge's classes up through the loader that loaded them (a child loader
        // where the jars came with --jars): it reads it as this thread's context class loader.
        Thread starter = Thread.currentThread();
        ClassLoader context = starter.getContextClassLoader();
        starter.setContextClassLoader(NativeBridge.class.getClassLoader());
        try {
            NativeBridge.startPython(o.python(), o.pythonPath().toArray(new String[0]), library,
                    JsonText.object(o.conf()));
        } finally {
            starter.setContextClassLoader(context);
        }
        ControlPlane plane = NativeBridge.control();
        if (plane == null) {
            throw new CudaBridgeException("cudabridge: Python started but installed no control plane", "java");
        }
        return new CudaBridge(plane, o);
    }
}
