package org.cudabridge;

/** What the first step of releasing a {@link TaskScope} found. */
enum ReleaseStart {
    /** Bound in Python: release it there. */
    IN_PYTHON,
    /** Never bound in Python (nobody applied its deferred bind, or the bind failed): nothing there. */
    JAVA_ONLY,
    /** Released already: this call gets the first release's report. */
    ALREADY
}
