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
            // issue 23 item 8: the Java threads' states, as the glossary says, not every state in the
            // interpreter (the emulated device's stream workers are Python threads with their own)
            assertEquals(ts.created() - ts.deleted(), s.get("bridge_thread_states"), s + " " + ts);
            assertTrue(s.get("bridge_thread_states") <= ts.inInterpreter(), s + " " + ts);
            if ("emulated".equals(System.getProperty("spark.cudabridge.backend", "emulated"))) {
                // its stream workers are Python threads with states of their own, which it leaves out
                assertTrue(s.get("bridge_thread_states") < ts.inInterpreter(), s + " " + ts);
            }
        }
        assertEquals(0L, bridge.statistics().get("bridge_java_tasks_bound"));
    }
}
