package org.cudabridge;

/** What releasing a task reclaimed: the buffers it never closed (its leaks). */
public final class ReleaseReport {
    private final long taskAttemptId;
    private final long leakedAllocations;
    private final long leakedBytes;

    ReleaseReport(long taskAttemptId, long leakedAllocations, long leakedBytes) {
        this.taskAttemptId = taskAttemptId;
        this.leakedAllocations = leakedAllocations;
        this.leakedBytes = leakedBytes;
    }

    public long taskAttemptId() { return taskAttemptId; }
    public long leakedAllocations() { return leakedAllocations; }
    public long leakedBytes() { return leakedBytes; }

    @Override
    public String toString() {
        return "ReleaseReport(task " + taskAttemptId + ": " + leakedAllocations + " leaked buffer(s), "
                + leakedBytes + " bytes)";
    }
}
