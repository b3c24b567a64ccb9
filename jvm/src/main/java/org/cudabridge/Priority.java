package org.cudabridge;

/**
 * The stream priority of a task ({@link CudaBridge#bindTask(long, String, Priority)}; the plugin's
 * {@code spark.cudabridge.taskPriority}). Each constant's {@link #wire()} name is what the
 * settings table lists for that key and what the Python service takes.
 */
public enum Priority {
    /** A normal-priority pool stream (the default). */
    NORMAL("normal"),
    /** A high-priority pool stream ({@code highPriorityStreams} of them per GPU). */
    HIGH("high");

    private final String wire;

    Priority(String wire) {
        this.wire = wire;
    }

    /** The name in configurations and in the call into Python. */
    public String wire() {
        return wire;
    }

    /** The priority of a wire name; throws IllegalArgumentException naming the accepted ones. */
    public static Priority fromWire(String name) {
        for (Priority p : values()) {
            if (p.wire.equals(name)) {
                return p;
            }
        }
        StringBuilder known = new StringBuilder();
        for (Priority p : values()) {
            known.append(known.length() == 0 ? "" : ", ").append(p.wire);
        }
        throw new IllegalArgumentException("priority must be one of " + known + ", got " + name);
    }

    @Override
    public String toString() {
        return wire;
    }
}
