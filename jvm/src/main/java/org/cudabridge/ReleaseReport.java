package org.cudabridge;

/** What releasing a task reclaimed: the buffers it never closed (its leaks); or, from a batched
 *  release ({@link CudaBridge#releaseTasks}), why its release failed. */
public final class ReleaseReport {
    private final long taskAttemptId;
    private final long leaksReclaimed;        // allocations the task still held, freed by the release
    private final long leakedBytesReclaimed;  // their bytes
    private final String failure;

    ReleaseReport(long taskAttemptId, long leaksReclaimed, long leakedBytesReclaimed) {
        this(taskAttemptId, leaksReclaimed, leakedBytesReclaimed, null);
    }

    private ReleaseReport(long taskAttemptId, long leaksReclaimed, long leakedBytesReclaimed, String failure) {
        this.taskAttemptId = taskAttemptId;
        this.leaksReclaimed = leaksReclaimed;
        this.leakedBytesReclaimed = leakedBytesReclaimed;
        this.failure = failure;
    }

    static ReleaseReport failed(long taskAttemptId, String failure) {
        return new ReleaseReport(taskAttemptId, 0, 0, failure);
    }

    /** Why the release failed (Python's message), or null. */
    public String failure() { return failure; }

    public long taskAttemptId() { return taskAttemptId; }
    public long leaksReclaimed() { return leaksReclaimed; }
    public long leakedBytesReclaimed() { return leakedBytesReclaimed; }

    @Override
    public String toString() {
        if (failure != null) {
            return "ReleaseReport(task " + taskAttemptId + ": failed: " + failure + ")";
        }
        return "ReleaseReport(task " + taskAttemptId + ": " + leaksReclaimed + " leak(s) reclaimed, "
                + leakedBytesReclaimed + " bytes)";
    }
}
