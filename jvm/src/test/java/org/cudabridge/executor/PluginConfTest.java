package org.cudabridge.executor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;

import org.cudabridge.BridgeOptions;
import org.cudabridge.Priority;
import org.junit.jupiter.api.Test;

class PluginConfTest {
    @Test
    void defaultsComeFromTheSettingsTable() {
        PluginConf c = PluginConf.defaults();
        assertEquals(Priority.NORMAL, c.taskPriority());
        assertEquals(TaskBind.LAZY, c.taskBind());
        assertTrue(c.asyncRelease());
        assertEquals("gpu", c.gpuResource());
    }

    @Test
    void pluginKeysGoToTheOptionsAndServiceKeysToTheService() {
        PluginConf c = new PluginConf(Map.of("spark.cudabridge.python", "/venv/bin/python",
                "spark.cudabridge.pythonPath", "/a:/b", "spark.cudabridge.backend", "emulated",
                "spark.cudabridge.taskBind", "ahead", "spark.executor.memory", "1g"));
        c.validate();
        assertEquals(TaskBind.AHEAD, c.taskBind());
        BridgeOptions o = c.toOptions(new String[] {"0", "1"});
        assertEquals("/venv/bin/python", o.python());
        assertEquals(java.util.List.of("/a", "/b"), o.pythonPath());
        assertEquals("emulated", o.conf().get("spark.cudabridge.backend"));
        assertEquals("0,1", o.conf().get(PluginConf.GPU_ADDRESSES));
        assertTrue(o.conf().keySet().stream().noneMatch(k -> k.equals("spark.cudabridge.python")));
    }

    @Test
    void admissionDoesNotGoWithBindsAheadOnTheLifecycleThread() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new PluginConf(Map.of(
                "spark.cudabridge.taskBind", "ahead", "spark.cudabridge.concurrentGpuTasks", "2")).validate());
        assertTrue(e.getMessage().contains("taskBind=ahead") && e.getMessage().contains("concurrentGpuTasks=2"),
                e.getMessage());
        new PluginConf(Map.of("spark.cudabridge.taskBind", "lazy", "spark.cudabridge.concurrentGpuTasks", "2")).validate();
        new PluginConf(Map.of("spark.cudabridge.taskBind", "ahead", "spark.cudabridge.concurrentGpuTasks", "0")).validate();
    }

    @Test
    void aBadValueOrAMisspelledKeyIsRefusedNamingIt() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> new PluginConf(Map.of("spark.cudabridge.taskBind", "soon")).validate());
        assertTrue(e.getMessage().contains("taskBind") && e.getMessage().contains("soon"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class,
                () -> new PluginConf(Map.of("spark.cudabridge.poolLimt", "1g")).validate());
        assertTrue(e.getMessage().contains("poolLimit"), "names the nearest known key: " + e.getMessage());
    }

    @Test
    void stagingCopiesDefaultToTheExecutorsTaskSlots() {
        assertEquals(8, PluginConf.taskSlots(Map.of("spark.executor.cores", "16", "spark.task.cpus", "2")));
        assertEquals(4, PluginConf.taskSlots(Map.of("spark.master", "local[4]")));
        assertEquals(4, PluginConf.taskSlots(Map.of("spark.master", "local[4,2]")));
        assertEquals(Runtime.getRuntime().availableProcessors(), PluginConf.taskSlots(Map.of("spark.master", "local[*]")));
        assertEquals(3, PluginConf.taskSlots(Map.of("spark.master", "local-cluster[2,3,1024]")));
        assertEquals(0, PluginConf.taskSlots(Map.of("spark.master", "yarn")));
        assertEquals(0, PluginConf.taskSlots(Map.of("spark.executor.cores", "many")));
        assertEquals(1, PluginConf.taskSlots(Map.of("spark.executor.cores", "1", "spark.task.cpus", "4")));
        PluginConf none = new PluginConf(Map.of());
        assertEquals("6", none.toOptions(null, 6).conf().get(PluginConf.STAGING_COPIES));
        assertEquals(null, none.toOptions(null, 0).conf().get(PluginConf.STAGING_COPIES));
        PluginConf set = new PluginConf(Map.of(PluginConf.STAGING_COPIES, "2"));
        assertEquals("2", set.toOptions(null, 6).conf().get(PluginConf.STAGING_COPIES));   // the user's key wins
    }
}
