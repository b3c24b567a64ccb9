/*
 * entry_waits.h: the Java threads inside a bridge call that may give GPU memory back or lead to it
 * (a free, a release, a copy, a launch, a Python function: anything of a task's), registered for
 * the deadlock breaker (python/cudabridge/pressure/) from before they wait for the gate and the GIL
 * until they leave the call.
 *
 * Why: Java sees a thread waiting for the GIL inside JNI as RUNNABLE, and Python does not see it at
 * all until its operation registers itself (a lease's inside list, the pool's books), and not
 * between GIL hand-offs inside the call either; yet the thread is on its way through one of its
 * task's operations. A breaker that missed it would call a task blocked while it runs (the false
 * "all blocked" verdict). So each such call publishes what it is for in the thread's own slot: its
 * task, or the buffer handle it names (a free, a copy: Python maps it to its owner), or "unknown"
 * (a batch of frees or releases), and clears it when it leaves; the breaker reads the table
 * (cb_entering) and counts those tasks as running, an unknown entry as possibly any task's. Calls
 * that can give no GPU memory back (ping, pinned host buffers, thread states) publish nothing. A
 * call that waits for memory itself clears its entry for the wait (cb_entry_pause/resume,
 * thread_states.h, from pressure/memory_waits.py): a waiting thread is a registered wait, not running.
 *
 * The cost on the hot path is a load and a store into the thread's own cache line as a call enters
 * and a store as it leaves (plus the depth count in the thread's own slot). A thread takes a slot
 * at its first call and gives it back when it ends (thread_states.h's slot destructor); a thread
 * that finds none free (more than CB_ENTRY_SLOTS at once) is counted in one shared counter, read as
 * an unknown entry, for its life.
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, before
 * thread_states.h, whose thread_slot holds each thread's slot number.
 */
#ifndef CB_ENTRY_WAITS_H
#define CB_ENTRY_WAITS_H

#include <stdatomic.h>

#define CB_ENTRY_SLOTS 1024
/* A slot's state: 0, none; else the kind in the top two bits and the value below. */
#define CB_ENTRY_NONE 0ULL
#define CB_ENTRY_KIND_SHIFT 62
#define CB_ENTRY_TASK 1ULL      /* the call's task */
#define CB_ENTRY_HANDLE 2ULL    /* a buffer handle the call names (its owner's) */
#define CB_ENTRY_UNKNOWN 3ULL   /* may be any task's */
#define CB_ENTRY_VALUE_MASK ((1ULL << CB_ENTRY_KIND_SHIFT) - 1)
#define CB_ENTRY_SKIPPED (~0ULL)   /* entry_begin's result for a call that publishes nothing */
#define CB_ENTRY_PAUSED_OVERFLOW 1ULL   /* cb_entry_pause's result for a thread counted in the overflow */

typedef struct {
    _Alignas(64) atomic_ullong state;   /* written by its thread only (and cleared at give-back) */
    atomic_int taken;
} entry_slot;

/* A thread's own part (in its thread_slot, thread_states.h). */
typedef struct {
    int slot;    /* its slot + 1; 0 none yet; -1 none (all taken, or none that would be given back): it counts in the overflow */
    int depth;   /* published calls it is inside now (a call may nest another: a Python function calling Java) */
} entry_mine;

static entry_slot g_entry_slots[CB_ENTRY_SLOTS];
static atomic_int g_entry_high;          /* slots [0, high) have been taken at some time */
static atomic_long g_entry_overflow;     /* published calls of threads that have no slot, now */

static int keep_slot(void);              /* thread_states.h: whether the thread's end will run its slot destructor */

/* A state of `kind` for `value`; a value that does not fit (a negative id) is unknown. */
static inline unsigned long long entry_state(unsigned long long kind, long long value) {
    if (value < 0 || ((unsigned long long)value & ~CB_ENTRY_VALUE_MASK) != 0) return CB_ENTRY_UNKNOWN << CB_ENTRY_KIND_SHIFT;
    return kind << CB_ENTRY_KIND_SHIFT | (unsigned long long)value;
}
#define ENTRY_TASK(t) entry_state(CB_ENTRY_TASK, (long long)(t))
#define ENTRY_HANDLE(h) entry_state(CB_ENTRY_HANDLE, (long long)(h))
#define ENTRY_UNKNOWN (CB_ENTRY_UNKNOWN << CB_ENTRY_KIND_SHIFT)
#define ENTRY_NOTHING CB_ENTRY_NONE   /* a call that can give no GPU memory back: not published */

/* This thread's slot, taken at its first published call (-1: none, for the thread's life). */
static int entry_slot_of_thread(entry_mine *m) {
    for (int i = 0; i < CB_ENTRY_SLOTS; i++) {
        int free_slot = 0;
        if (atomic_load_explicit(&g_entry_slots[i].taken, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&g_entry_slots[i].taken, &free_slot, 1)) {
            if (!keep_slot()) {   /* it would never be given back at the thread's end: not taken */
                atomic_store(&g_entry_slots[i].taken, 0);
                break;
            }
            int high = atomic_load(&g_entry_high);
            while (high < i + 1 && !atomic_compare_exchange_weak(&g_entry_high, &high, i + 1)) {}
            m->slot = i + 1;
            return i;
        }
    }
    m->slot = -1;
    return -1;
}

/* Entering a call that is for `state` (ENTRY_TASK, ENTRY_HANDLE, ENTRY_UNKNOWN, or ENTRY_NOTHING),
 * before its waits for the gate and the GIL. Returns what entry_end takes: the state before (an
 * outer call's, or none). */
static inline unsigned long long entry_begin(entry_mine *m, unsigned long long state) {
    if (state == CB_ENTRY_NONE) return CB_ENTRY_SKIPPED;
    int i = m->slot > 0 ? m->slot - 1 : m->slot == 0 ? entry_slot_of_thread(m) : -1;
    m->depth++;
    if (i < 0) {
        atomic_fetch_add(&g_entry_overflow, 1);
        return CB_ENTRY_NONE;
    }
    unsigned long long prior = atomic_load_explicit(&g_entry_slots[i].state, memory_order_relaxed);
    atomic_store_explicit(&g_entry_slots[i].state, state, memory_order_release);
    return prior;
}

/* Leaving the call: `prior` is its entry_begin's result. */
static inline void entry_end(entry_mine *m, unsigned long long prior) {
    if (prior == CB_ENTRY_SKIPPED) return;
    m->depth--;
    if (m->slot > 0) atomic_store_explicit(&g_entry_slots[m->slot - 1].state, prior, memory_order_release);
    else atomic_fetch_sub(&g_entry_overflow, 1);
}

/* The calling thread stops counting as inside its call while it waits (a registered wait):
 * returns what entry_resume takes (0: nothing was published). */
static unsigned long long entry_pause(entry_mine *m) {
    if (m->depth == 0) return 0;
    if (m->slot > 0) {
        unsigned long long s = atomic_load_explicit(&g_entry_slots[m->slot - 1].state, memory_order_relaxed);
        atomic_store_explicit(&g_entry_slots[m->slot - 1].state, CB_ENTRY_NONE, memory_order_release);
        return s;
    }
    atomic_fetch_sub(&g_entry_overflow, 1);
    return CB_ENTRY_PAUSED_OVERFLOW;
}

static void entry_resume(entry_mine *m, unsigned long long saved) {
    if (saved == 0) return;
    if (m->slot > 0) atomic_store_explicit(&g_entry_slots[m->slot - 1].state, saved, memory_order_release);
    else atomic_fetch_add(&g_entry_overflow, 1);
}

/* The thread ends (thread_states.h's slot destructor): its slot goes back. */
static void entry_slot_give_back(entry_mine *m) {
    if (m->slot <= 0) return;
    atomic_store(&g_entry_slots[m->slot - 1].state, CB_ENTRY_NONE);
    atomic_store(&g_entry_slots[m->slot - 1].taken, 0);
    m->slot = 0;
}

/* For the breaker (python/cudabridge/jvm/entry_waits.py reads it through ctypes, the GIL held): the
 * number of threads inside such calls now, and the first `max` of their states in `states` (the
 * overflow's as unknown). A thread that comes or goes during the read may or may not be counted. */
static int cb_entering(unsigned long long *states, int max) {
    int n = 0;
    int high = atomic_load(&g_entry_high);
    for (int i = 0; i < high; i++) {
        unsigned long long s = atomic_load_explicit(&g_entry_slots[i].state, memory_order_acquire);
        if (s == CB_ENTRY_NONE) continue;
        if (n < max) states[n] = s;
        n++;
    }
    long overflow = atomic_load(&g_entry_overflow);
    for (long k = 0; k < overflow; k++, n++)
        if (n < max) states[n] = ENTRY_UNKNOWN;
    return n;
}

#endif /* CB_ENTRY_WAITS_H */
