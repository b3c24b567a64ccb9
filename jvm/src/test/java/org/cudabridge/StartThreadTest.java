package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The thread that started Python keeps the interpreter's main thread state; when that thread ends,
 * after calls that gave it a kept slot (a free, a copy through its staging buffer), the state stays:
 * Python is never finalized, and deleting it ended {@code threading}'s main thread (a bridge's own
 * slot destructor did, for the thread of a start that had made such calls). A JVM of its own: the
 * bridge starts on a thread of this test.
 */
@Tag("own-jvm")
@SuppressWarnings("try")   // scopes held for their task binding only
class StartThreadTest {
    static CudaBridge bridge;

    @AfterAll
    static void shutDown() {
        if (bridge != null) {
            bridge.shutdown();
        }
    }

    @Test
    void theMainThreadStateOutlivesTheThreadThatStartedPython() throws Exception {
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread starter = new Thread(() -> {
            try {
                bridge = CudaBridge.start(BridgeOptions.fromSystemProperties());
                try (TaskScope t = bridge.bindTask(1); DeviceBuffer b = bridge.allocate(4096)) {
                    b.copyFrom(new byte[4096]);   // its staging buffer, and a published call of the task
                }
            } catch (Throwable e) {
                failed.set(e);
            }
        });
        starter.start();
        starter.join();
        assertNull(failed.get());
        List<String> path = List.of(Path.of(System.getProperty("user.dir"), "tests", "python_functions").toString());
        try (TaskScope t = bridge.bindTask(2)) {
            assertEquals(true, bridge.pythonFunction("functions_for_tests:main_thread_alive", path).call());
        }
    }
}
