package org.cudabridge;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.ArrayList;
import java.util.List;

/** Test helper: runs a body on n threads at once and fails with every throwable they raised. */
final class Concurrently {
    interface Body {
        void run(int thread) throws Exception;
    }

    private Concurrently() {}

    static void run(int threads, Body body) throws InterruptedException {
        List<Thread> started = new ArrayList<>();
        List<Throwable> errors = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int id = t;
            Thread th = new Thread(() -> {
                try {
                    body.run(id);
                } catch (Throwable e) {   // an assertion in a thread would otherwise vanish
                    synchronized (errors) {
                        errors.add(e);
                    }
                }
            });
            started.add(th);
            th.start();
        }
        for (Thread th : started) th.join();
        assertEquals(List.of(), errors);
    }
}
