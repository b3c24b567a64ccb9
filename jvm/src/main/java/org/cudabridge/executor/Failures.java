package org.cudabridge.executor;

import org.cudabridge.CudaBridgeException;

/** How the executor side words a failure for its logs and for the tasks it fails. */
public final class Failures {
    private Failures() {}

    /** The message of {@code t}, or its class and message where that says more. */
    public static String describe(Throwable t) {
        if (t instanceof ExceptionInInitializerError && t.getCause() != null) {
            return describe(t.getCause()); // e.g. the settings table could not be read
        }
        String m = t.getMessage();
        return (m == null || m.isEmpty()) ? t.toString() : (t instanceof CudaBridgeException || m.startsWith("cudabridge")
                ? m : t.getClass().getName() + ": " + m);
    }

    /** {@code s} on one line, at most 2000 characters (Python tracebacks are long). */
    public static String oneLine(String s) {
        String flat = s.replace("\r", "").replace("\n", " | ").replaceAll("\\s+", " ").trim();
        return flat.length() > 2000 ? flat.substring(0, 2000) + " ..." : flat;
    }

    /** Whether a task's exception (its class name, message and stack trace; any may be null) went
     *  through this project's code or names CUDA: only then can a failed task be the GPU's fault. */
    public static boolean mayBeGpuFault(String... exceptionText) {
        for (String text : exceptionText) {
            if (text != null && (text.contains("org.cudabridge.") || text.contains("CudaBridgeException")
                    || text.contains("CUDA") || text.contains("cuda"))) {
                return true;
            }
        }
        return false;
    }
}
