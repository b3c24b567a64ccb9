/*
 * entry_waits.h: the Java threads waiting in the bridge to enter Python (for the gate, then for the
 * GIL), registered where they wait, for the deadlock breaker (python/cudabridge/pressure/).
 *
 * Why: Java sees a thread waiting for the GIL inside JNI as RUNNABLE, and Python does not see it at
 * all, yet it is on its way into one of its task's operations (a free, a release) that may give
 * memory back. A breaker that missed it would call a task blocked while it is about to run (the
 * false "all blocked" verdict). So each thread publishes, before it waits for the gate or the GIL,
 * the task its call is for (or "unknown": a free or a copy names a handle, not a task), and clears
 * it once it holds the GIL; the breaker reads the table (cb_entering) and counts those tasks as
 * running, and an unknown one as possibly any task's.
 *
 * The cost on the hot path is two stores into this thread's own cache line. A thread takes a slot
 * at its first call and gives it back when it ends (thread_states.h's slot destructor); threads
 * beyond CB_ENTRY_SLOTS at once count in one shared counter, read as unknown entries.
 *
 * Part of the bridge library's one translation unit: cudabridge_jni.c includes it once, before
 * thread_states.h, whose GIL sections publish through it.
 */
#ifndef CB_ENTRY_WAITS_H
#define CB_ENTRY_WAITS_H

#include <stdatomic.h>

#define CB_ENTRY_SLOTS 1024
#define CB_ENTRY_NONE 0LL      /* the slot's thread is not waiting to enter */
#define CB_ENTRY_UNKNOWN 1LL   /* waiting, for a call that names no task */
/* otherwise: waiting, for task (state - 2) */

typedef struct {
    _Alignas(64) atomic_llong state;
    atomic_int taken;
} entry_slot;

static entry_slot g_entry_slots[CB_ENTRY_SLOTS];
static atomic_int g_entry_high;          /* slots [0, high) have been taken at some time */
static atomic_long g_entry_overflow;     /* threads waiting to enter that have no slot */

static void keep_slot(void);             /* thread_states.h: the thread's end runs its slot destructor */

/* This thread's slot, taken at its first call into *mine (the thread's own: thread_states.h's
 * thread_slot.entry, the slot + 1, 0 none yet); -1: none free, tried again at the next call. */
static int entry_slot_of_thread(int *mine) {
    for (int i = 0; i < CB_ENTRY_SLOTS; i++) {
        int free_slot = 0;
        if (atomic_load_explicit(&g_entry_slots[i].taken, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&g_entry_slots[i].taken, &free_slot, 1)) {
            int high = atomic_load(&g_entry_high);
            while (high < i + 1 && !atomic_compare_exchange_weak(&g_entry_high, &high, i + 1)) {}
            *mine = i + 1;
            keep_slot();   /* the slot goes back when the thread ends (entry_slot_give_back) */
            return i;
        }
    }
    return -1;
}

/* Before the thread may wait for the gate or the GIL: what it waits for (task < 0: unknown);
 * `mine`: the thread's slot (entry_slot_of_thread). Returns what entry_end takes: the slot, or -1
 * where the thread is counted in the overflow. */
static inline int entry_begin(int *mine, long long task) {
    int i = *mine ? *mine - 1 : entry_slot_of_thread(mine);
    long long state = task < 0 ? CB_ENTRY_UNKNOWN : task + 2;
    if (i >= 0) atomic_store_explicit(&g_entry_slots[i].state, state, memory_order_release);
    else atomic_fetch_add(&g_entry_overflow, 1);
    return i;
}

/* Once the thread holds the GIL (or gave up): `entry` is entry_begin's result. */
static inline void entry_end(int entry) {
    if (entry >= 0) atomic_store_explicit(&g_entry_slots[entry].state, CB_ENTRY_NONE, memory_order_release);
    else atomic_fetch_sub(&g_entry_overflow, 1);
}

/* The thread ends (thread_states.h's slot destructor): its slot goes back. */
static void entry_slot_give_back(int *mine) {
    if (*mine == 0) return;
    atomic_store(&g_entry_slots[*mine - 1].state, CB_ENTRY_NONE);
    atomic_store(&g_entry_slots[*mine - 1].taken, 0);
    *mine = 0;
}

/* For the breaker (python/cudabridge/jvm/hot_path.py reads it through ctypes, the GIL held): the
 * number of threads waiting to enter now, and the first `max` of their tasks in `tasks` (-1:
 * unknown). A thread that starts or stops waiting during the read may or may not be counted. */
static int cb_entering(long long *tasks, int max) {
    int n = 0;
    int high = atomic_load(&g_entry_high);
    for (int i = 0; i < high; i++) {
        long long s = atomic_load_explicit(&g_entry_slots[i].state, memory_order_acquire);
        if (s == CB_ENTRY_NONE) continue;
        if (n < max) tasks[n] = s == CB_ENTRY_UNKNOWN ? -1 : s - 2;
        n++;
    }
    long overflow = atomic_load(&g_entry_overflow);
    for (long k = 0; k < overflow; k++, n++)
        if (n < max) tasks[n] = -1;
    return n;
}

#endif /* CB_ENTRY_WAITS_H */
