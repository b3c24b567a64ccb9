package org.cudabridge;

/** Python thread states: every one in the interpreter now (the Java threads' and Python's own
 *  threads', such as the emulated device's stream workers), and those the bridge created and
 *  deleted for Java threads (a Java thread that called into Python keeps one until it ends). */
public record ThreadStates(long inInterpreter, long created, long deleted) {
    /** The thread states the bridge keeps for Java threads now: {@code created - deleted} (the
     *  statistic {@code bridge_thread_states}). */
    public long kept() {
        return created - deleted;
    }
}
