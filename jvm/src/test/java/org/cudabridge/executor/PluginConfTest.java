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
    void aBadValueOrAMisspelledKeyIsRefusedNamingIt() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> new PluginConf(Map.of("spark.cudabridge.taskBind", "soon")).validate());
        assertTrue(e.getMessage().contains("taskBind") && e.getMessage().contains("soon"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class,
                () -> new PluginConf(Map.of("spark.cudabridge.poolLimt", "1g")).validate());
        assertTrue(e.getMessage().contains("poolLimit"), "names the nearest known key: " + e.getMessage());
    }
}
