package org.cudabridge.examples;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Collection;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;

import org.cudabridge.spark.MetricNames;

/** The lines both the Spark job and the harness print, and their JSON form for the tests. */
public final class Summary {
    private final LinkedHashMap<String, Object> values = new LinkedHashMap<>();
    private final Map<String, Long> statistics = new LinkedHashMap<>();

    public Summary put(String key, Object value) {
        values.put(key, value);
        return this;
    }

    public Object get(String key) {
        return values.get(key);
    }

    /** Tasks run, distinct streams and GPUs (per executor), bytes moved, verify failures, checksum. */
    public static Summary of(Collection<PartitionWork.Result> results) {
        Summary s = new Summary();
        Set<String> streams = new HashSet<>();
        long bytes = 0;
        int bad = 0;
        int leaked = 0;
        Set<String> executors = new HashSet<>();
        Set<String> gpus = new HashSet<>();
        for (PartitionWork.Result r : results) {
            streams.add(r.executorId + "/" + r.gpu + "/" + r.stream);
            executors.add(String.valueOf(r.executorId));
            gpus.add(r.executorId + "/" + r.gpu);
            bytes += r.bytesMoved;
            bad += r.ok() ? 0 : 1;
            leaked += r.leakedOnPurpose;
        }
        s.put("tasks_run", results.size());
        s.put("executors", executors.size());
        s.put("distinct_streams_used", streams.size());
        s.put("gpus_used", gpus.size());                    // distinct (executor, GPU ordinal) pairs
        s.put("bytes_moved", bytes);
        s.put("verify_failures", bad);
        s.put("leaked_on_purpose", leaked);
        return s;
    }

    /** The service's statistics (and the plugin's counters), printed under their metric names. */
    public Summary statistics(Map<String, Long> stats) {
        statistics.clear();
        statistics.putAll(stats);
        return this;
    }

    public String render() {
        StringBuilder sb = new StringBuilder();
        for (Map.Entry<String, Object> e : values.entrySet()) {
            sb.append(String.format("%-32s %s%n", e.getKey(), e.getValue()));
        }
        if (!statistics.isEmpty()) {
            sb.append("metrics (plugin.org.cudabridge.spark.CudaBridgePlugin.executor.*, summed over executors):\n");
            for (String name : MetricNames.NAMES) {
                sb.append(String.format("  %-30s %d%n", name, statistics.getOrDefault(name, 0L)));
            }
        }
        return sb.toString();
    }

    public String toJson() {
        StringBuilder sb = new StringBuilder("{");
        for (Map.Entry<String, Object> e : values.entrySet()) {
            quote(sb, e.getKey());
            sb.append(':');
            Object v = e.getValue();
            if (v instanceof Number || v instanceof Boolean) {
                sb.append(v);
            } else {
                quote(sb, String.valueOf(v));
            }
            sb.append(',');
        }
        sb.append("\"statistics\":{");
        boolean first = true;
        for (Map.Entry<String, Long> e : statistics.entrySet()) {
            if (!first) {
                sb.append(',');
            }
            first = false;
            quote(sb, e.getKey());
            sb.append(':').append(e.getValue());
        }
        return sb.append("}}").toString();
    }

    public void writeJson(String path) throws IOException {
        if (path != null) {
            Path p = Paths.get(path);
            Files.write(p, toJson().getBytes(StandardCharsets.UTF_8));
        }
    }

    private static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                sb.append('\\').append(c);
            } else if (c < 0x20) {
                sb.append(String.format("\\u%04x", (int) c));
            } else {
                sb.append(c);
            }
        }
        sb.append('"');
    }
}
