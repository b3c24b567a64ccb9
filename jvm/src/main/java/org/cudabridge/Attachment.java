package org.cudabridge;

/** An attachment of the calling thread to a task ({@link CudaBridge#attach}); closing it, on the
 *  same thread, restores the thread's previous task. */
public final class Attachment implements AutoCloseable {
    private final TaskScope scope;
    private final TaskScope previous;
    private final Thread thread;
    private boolean closed;

    Attachment(TaskScope scope, TaskScope previous) {
        this.scope = scope;
        this.previous = previous;
        this.thread = Thread.currentThread();
    }

    public TaskScope task() { return scope; }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        if (Thread.currentThread() != thread) {
            throw new IllegalStateException("an Attachment must be closed on the thread that attached");
        }
        closed = true;
        TaskTable.restore(previous);
    }
}
