package org.cudabridge.spark;

import org.apache.spark.ExceptionFailure;
import org.apache.spark.TaskFailedReason;
import org.cudabridge.executor.Failures;

/**
 * Which task failures may be the GPU's rather than the task's. After a sticky CUDA error (an
 * illegal address, a launch failure, an uncorrectable ECC error) every GPU call of the process
 * fails, so the tasks that fail are not buggy: the executor is. Only a failure that went through
 * this project's code or names CUDA is worth the device probe (one call into Python); a killed
 * task, a fetch failure, a lost executor or a plain exception of the task's own code is not.
 */
final class TaskFailures {
    private TaskFailures() {}

    static boolean mayBeGpuFault(TaskFailedReason reason) {
        if (!(reason instanceof ExceptionFailure failure)) {
            return false;
        }
        return Failures.mayBeGpuFault(failure.className(), failure.description(), failure.fullStackTrace());
    }
}
