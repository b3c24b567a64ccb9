package org.cudabridge.executor;

/**
 * When a starting task is bound to a pool stream in Python ({@code spark.cudabridge.taskBind}).
 * Each constant's {@link #wire()} name is what the settings table lists for that key.
 */
public enum TaskBind {
    /** At the task's first GPU call, on its thread (a task that never touches the GPU costs no Python call). */
    LAZY("lazy"),
    /** On the executor's lifecycle thread, ahead of the task's first GPU call (a GPU call that comes first binds it). */
    AHEAD("ahead"),
    /** In {@code onTaskStart}, on the task's thread. */
    EAGER("eager");

    private final String wire;

    TaskBind(String wire) {
        this.wire = wire;
    }

    /** The name in configurations. */
    public String wire() {
        return wire;
    }

    /** The mode of a wire name; throws IllegalArgumentException naming the accepted ones. */
    public static TaskBind fromWire(String name) {
        for (TaskBind b : values()) {
            if (b.wire.equals(name)) {
                return b;
            }
        }
        StringBuilder known = new StringBuilder();
        for (TaskBind b : values()) {
            known.append(known.length() == 0 ? "" : ", ").append(b.wire);
        }
        throw new IllegalArgumentException("task bind mode must be one of " + known + ", got " + name);
    }

    @Override
    public String toString() {
        return wire;
    }
}
