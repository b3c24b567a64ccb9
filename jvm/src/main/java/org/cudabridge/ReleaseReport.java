package org.cudabridge;

/**
 * What releasing a task reclaimed: the buffers it never closed (its leaks): {@code leaksReclaimed}
 * allocations of {@code leakedBytesReclaimed} bytes; or, from a batched release
 * ({@link CudaBridge#releaseTasks}), why its release failed ({@code failure}, else null).
 */
public record ReleaseReport(long taskAttemptId, long leaksReclaimed, long leakedBytesReclaimed, String failure) {
    static ReleaseReport of(long taskAttemptId, long leaksReclaimed, long leakedBytesReclaimed) {
        return new ReleaseReport(taskAttemptId, leaksReclaimed, leakedBytesReclaimed, null);
    }

    /** A release that reclaimed nothing (the task never reached Python, or the service is closed). */
    static ReleaseReport empty(long taskAttemptId) {
        return of(taskAttemptId, 0, 0);
    }

    static ReleaseReport failed(long taskAttemptId, String failure) {
        return new ReleaseReport(taskAttemptId, 0, 0, failure);
    }

    @Override
    public String toString() {
        if (failure != null) {
            return "ReleaseReport(task " + taskAttemptId + ": failed: " + failure + ")";
        }
        return "ReleaseReport(task " + taskAttemptId + ": " + leaksReclaimed + " leak(s) reclaimed, "
                + leakedBytesReclaimed + " bytes)";
    }
}
