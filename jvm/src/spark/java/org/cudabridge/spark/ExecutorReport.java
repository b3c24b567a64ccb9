package org.cudabridge.spark;

import java.io.Serializable;
import java.util.Collections;
import java.util.Map;
import java.util.TreeMap;

/** An executor's statistics, sent to the driver plugin through {@code PluginContext.send}. */
public final class ExecutorReport implements Serializable {
    private static final long serialVersionUID = 1L;

    private final String executorId;
    private final long sequence;
    private final boolean available;
    private final String failure;
    private final TreeMap<String, Long> statistics;

    public ExecutorReport(String executorId, long sequence, boolean available, String failure, Map<String, Long> statistics) {
        this.executorId = executorId;
        this.sequence = sequence;
        this.available = available;
        this.failure = failure;
        this.statistics = new TreeMap<>(statistics);
    }

    public String executorId() { return executorId; }
    public long sequence() { return sequence; }
    public boolean available() { return available; }
    public String failure() { return failure; }
    public Map<String, Long> statistics() { return Collections.unmodifiableMap(statistics); }

    @Override
    public String toString() {
        return "ExecutorReport(" + executorId + " #" + sequence + (available ? "" : ", failed: " + failure) + ", "
                + statistics + ")";
    }
}
