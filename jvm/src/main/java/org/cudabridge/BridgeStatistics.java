package org.cudabridge;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The executor-level numbers {@link CudaBridge#statistics()} returns: the service's (pool bytes in
 * use / reserved / peak, streams, tasks, event polls, GPU waits, host syncs, OOMs, leaks, the
 * bridge's call counters) plus the Java side's own, {@link #JAVA_STATISTICS}.
 */
public final class BridgeStatistics {
    /** What the Java side adds to the service's numbers, named once here. */
    public static final List<String> JAVA_STATISTICS = List.of("bridge_thread_states", "bridge_thread_states_created",
            "bridge_thread_states_deleted", "bridge_java_tasks_bound");

    private BridgeStatistics() {}

    /** Every key a snapshot holds, known without Python: the service's (the build writes Python's
     *  {@code BridgeControl.statistics_names()} into the jar as {@code org/cudabridge/statistics.txt}),
     *  then {@link #JAVA_STATISTICS}. */
    public static List<String> names() {
        List<String> out = new ArrayList<>(BuildTables.lines(BuildTables.STATISTICS));
        out.addAll(JAVA_STATISTICS);
        return Collections.unmodifiableList(out);
    }

    /** The service's numbers with the Java side's added. */
    static Map<String, Long> snapshot(Map<String, Long> service, int javaTasksBound) {
        Map<String, Long> m = new TreeMap<>(service);
        ThreadStates ts = NativeBridge.threadStates();
        long[] own = {ts.kept(), ts.created(), ts.deleted(), javaTasksBound};   // JAVA_STATISTICS' order
        for (int i = 0; i < own.length; i++) {
            m.put(JAVA_STATISTICS.get(i), own[i]);
        }
        return Collections.unmodifiableMap(m);
    }
}
