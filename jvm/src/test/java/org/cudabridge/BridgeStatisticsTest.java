package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import java.util.TreeSet;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** The statistics snapshot: its keys are known without Python and are exactly what Python sends. */
@Tag("own-jvm")
class BridgeStatisticsTest extends RunningBridge {
    @Test
    void theNamesKnownWithoutPythonAreTheSnapshotsKeys() {
        List<String> names = BridgeStatistics.names();
        assertTrue(names.containsAll(BridgeStatistics.JAVA_STATISTICS));
        assertEquals(new TreeSet<>(names), new TreeSet<>(bridge.statistics().keySet()));
    }

    @Test
    void theJavaSideCountsItsTasksAndThreadStates() {
        try (TaskScope t = bridge.bindTask(5)) {
            Map<String, Long> s = bridge.statistics();
            assertEquals(1L, s.get("bridge_java_tasks_bound"), t.toString());
            assertTrue(s.get("bridge_thread_states_created") >= 1, s.toString());
            ThreadStates ts = CudaBridge.threadStates();
            assertTrue(ts.inInterpreter() >= 1 && ts.created() >= ts.deleted(), ts.toString());
        }
        assertEquals(0L, bridge.statistics().get("bridge_java_tasks_bound"));
    }
}
