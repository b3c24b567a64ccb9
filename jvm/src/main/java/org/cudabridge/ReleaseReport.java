package org.cudabridge;

/** What releasing a task reclaimed: the buffers it never closed (its leaks); or, from a batched
 *  release ({@link CudaBridge#releaseTasks}), why its release failed. */
public final class ReleaseReport {
    private final long taskAttemptId;
    private final long leakedAllocations;
    private final long leakedBytes;
    private final String failure;

    ReleaseReport(long taskAttemptId, long leakedAllocations, long leakedBytes) {
        this(taskAttemptId, leakedAllocations, leakedBytes, null);
    }

    private ReleaseReport(long taskAttemptId, long leakedAllocations, long leakedBytes, String failure) {
        this.taskAttemptId = taskAttemptId;
        this.leakedAllocations = leakedAllocations;
        this.leakedBytes = leakedBytes;
        this.failure = failure;
    }

    static ReleaseReport failed(long taskAttemptId, String failure) {
        return new ReleaseReport(taskAttemptId, 0, 0, failure);
    }

    /** Why the release failed (Python's message), or null. */
    public String failure() { return failure; }

    public long taskAttemptId() { return taskAttemptId; }
    public long leakedAllocations() { return leakedAllocations; }
    public long leakedBytes() { return leakedBytes; }

    @Override
    public String toString() {
        if (failure != null) {
            return "ReleaseReport(task " + taskAttemptId + ": failed: " + failure + ")";
        }
        return "ReleaseReport(task " + taskAttemptId + ": " + leakedAllocations + " leaked buffer(s), "
                + leakedBytes + " bytes)";
    }
}
