/*
 * hot_gate.h: the gate Java threads pass before they take the GIL for a short hot call
 * (allocate, free, memset, stream, ping). Included by cudabridge_jni.c only.
 *
 * Why: every hot call takes and drops the GIL. With many Java threads that hand-off is the cost,
 * not the call: CPython's drop_gil signals a waiter on every release, the woken thread usually
 * finds the GIL taken again and sleeps, and the interpreter's objects move between cores' caches
 * with every call, so many threads together make far fewer calls per second than one alone (a
 * Java monitor before the GIL helps only partly; bench/RESULTS.md, "JVM bridge after the C hot
 * core and the gate (issue 3, session 3)", gated against ungated). Python's own threads do not
 * suffer this because a thread keeps the GIL for a switch interval (5 ms).
 *
 * The gate gives Java threads the same property, with a much shorter interval, and costs the
 * thread that holds it no system call:
 *  - it is biased: the thread that passed it last passes again with one compare-and-swap;
 *  - another thread passes a free gate only once it has stayed free for CB_GATE_REUSE_NS (the
 *    biased thread is then doing other work), or when it holds the claim (below);
 *  - a holder that has had the gate for the hold interval (-Dcudabridge.gate.holdMicros) while
 *    others wait wakes one sleeper as it leaves, and goes on. The woken thread claims the gate
 *    and spins; the holder sees the claim at its next exit and lets it in. So the gate never
 *    stands idle while a woken thread waits to be scheduled on a core (a wait far longer than a
 *    hot call, longest where threads outnumber cores; a gate handed over at the wake-up would
 *    stand idle for it at every hand-off), and no thread waits much longer than the interval
 *    times the number of threads ahead of it.
 * Waiters sleep on a futex and never spin for long: on a machine with fewer cores than threads
 * a spinner takes the core from the holder. One waiter, the watcher, sleeps with a short timeout
 * to notice a holder that went idle; the others sleep until a hand-off (or a watcher that got
 * in) wakes one of them, so that a crowd of waiters does not wake up every interval.
 *
 * Mutual exclusion rests on the compare-and-swap of `held` alone; the rest only decides who
 * tries. Calls that may wait (copies to heap arrays, synchronize, pinned allocation) never pass
 * the gate: a thread waiting for the GPU must not hold up the others.
 */
#ifndef CB_HOT_GATE_H
#define CB_HOT_GATE_H

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CB_GATE_REUSE_NS 10000       /* a free gate stays its holder's this long after an exit */
#define CB_GATE_CLAIM_NS 100000      /* a claim lapses after this (its claimant lost its core) */
#define CB_GATE_SPIN 64              /* polls before a waiter sleeps */
#define CB_GATE_SAFETY 50            /* non-watchers also wake after this many intervals */

#if defined(__x86_64__) || defined(__i386__)
#define CB_CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CB_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CB_CPU_RELAX() ((void)0)
#endif

typedef struct {
    atomic_int held;                 /* 1 while a thread is between enter and exit */
    atomic_uintptr_t bias;           /* the thread that passed last (its token), 0 none */
    atomic_llong released_ns;        /* when the gate was last left */
    atomic_llong owner_since;        /* when `bias` last changed hands */
    atomic_uintptr_t claim;          /* a woken waiter spinning for the gate, 0 none */
    atomic_llong claim_since;
    atomic_llong wake_sent_ns;       /* the holder's last hand-off wake */
    atomic_uintptr_t watcher;        /* the waiter that sleeps with a short timeout, 0 none */
    atomic_int waiters;
    atomic_uint seq;                 /* futex word, bumped by each wake */
    atomic_uint handoff_seq;         /* bumped by hand-off wakes only: their sleeper claims */
    atomic_int enabled;              /* -Dcudabridge.gate=false turns it off */
    atomic_llong wait_ns;            /* the hold interval */
    atomic_long handoffs, sleeps;    /* statistics */
} hot_gate;

static hot_gate g_gate = {.enabled = 1, .wait_ns = 1000000};

static inline long long gate_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void gate_futex_wait(atomic_uint *word, unsigned seen, long long ns) {
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    /* EAGAIN (the word moved), EINTR, ETIMEDOUT: every outcome means "look again". */
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
}

static inline void gate_wake_one(int handoff) {
    if (handoff) atomic_fetch_add(&g_gate.handoff_seq, 1);
    atomic_fetch_add(&g_gate.seq, 1);
    syscall(SYS_futex, (unsigned *)&g_gate.seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* May `me` try to take the free gate at time `t`? */
static inline int gate_may_take(uintptr_t me, long long t) {
    uintptr_t c = atomic_load(&g_gate.claim);
    if (c != 0) return c == me || t - atomic_load(&g_gate.claim_since) >= CB_GATE_CLAIM_NS;
    uintptr_t b = atomic_load(&g_gate.bias);
    return b == me || b == 0 || t - atomic_load(&g_gate.released_ns) >= CB_GATE_REUSE_NS;
}

static inline int gate_try(uintptr_t me, long long t) {
    int expect = 0;
    if (!atomic_compare_exchange_strong(&g_gate.held, &expect, 1)) return 0;
    if (atomic_load(&g_gate.bias) != me) {
        atomic_store(&g_gate.bias, me);
        atomic_store(&g_gate.owner_since, t ? t : gate_now());
    }
    /* Ours, or lapsed: either way it is spent. */
    if (atomic_load(&g_gate.claim) != 0) atomic_store(&g_gate.claim, 0);
    return 1;
}

/* Returns 1 if the gate was passed (gate_exit must follow), 0 if it is off. `me`: the calling
 * thread's token. */
static int gate_enter(uintptr_t me) {
    if (!atomic_load_explicit(&g_gate.enabled, memory_order_relaxed)) return 0;
    /* The biased thread's way in: no clock, no system call. */
    if (atomic_load(&g_gate.bias) == me && atomic_load(&g_gate.claim) == 0 && gate_try(me, 0)) return 1;
    long long start = gate_now();
    if (!atomic_load(&g_gate.held) && gate_may_take(me, start) && gate_try(me, start)) return 1;
    atomic_fetch_add(&g_gate.waiters, 1);
    int claimed = 0;
    for (int polls = 0;; polls++) {
        long long t = gate_now();
        if (!atomic_load(&g_gate.held) && gate_may_take(me, t) && gate_try(me, t)) break;
        if (claimed) {
            /* Woken by a hand-off: spin, the holder lets us in at its next exit. */
            if (atomic_load(&g_gate.claim) == me && t - atomic_load(&g_gate.claim_since) < CB_GATE_CLAIM_NS) {
                CB_CPU_RELAX();
                continue;
            }
            claimed = 0; /* lapsed (or taken by a thread that found it lapsed): wait again */
            uintptr_t mine = me;
            atomic_compare_exchange_strong(&g_gate.claim, &mine, 0);
            polls = CB_GATE_SPIN;
        }
        if (polls < CB_GATE_SPIN) {
            CB_CPU_RELAX();
            continue;
        }
        /* Read the futex words before the last look: a wake after this look changes them, so
         * the sleep below returns at once instead of missing that wake. */
        unsigned seen = atomic_load(&g_gate.seq);
        unsigned seen_handoff = atomic_load(&g_gate.handoff_seq);
        uintptr_t none = 0;
        int watching = atomic_load(&g_gate.watcher) == me ||
                       atomic_compare_exchange_strong(&g_gate.watcher, &none, me);
        t = gate_now();
        if (!atomic_load(&g_gate.held) && gate_may_take(me, t) && gate_try(me, t)) break;
        long long wait = atomic_load_explicit(&g_gate.wait_ns, memory_order_relaxed);
        long long sleep_ns = wait * CB_GATE_SAFETY;
        if (watching) {
            /* Free but still its holder's: ours once it stays free. Held: look again when the
             * holder's interval is over. */
            long long due = atomic_load(&g_gate.owner_since) + wait + CB_GATE_REUSE_NS - t;
            sleep_ns = !atomic_load(&g_gate.held) || due < CB_GATE_REUSE_NS ? CB_GATE_REUSE_NS : due;
        }
        atomic_fetch_add_explicit(&g_gate.sleeps, 1, memory_order_relaxed);
        gate_futex_wait(&g_gate.seq, seen, sleep_ns);
        if (atomic_load(&g_gate.handoff_seq) != seen_handoff) {
            none = 0;
            if (atomic_compare_exchange_strong(&g_gate.claim, &none, me)) {
                atomic_store(&g_gate.claim_since, gate_now());
                claimed = 1;
            }
        }
    }
    int left = atomic_fetch_sub(&g_gate.waiters, 1) - 1;
    if (atomic_load(&g_gate.watcher) == me) {
        /* Pass the watch on: wake a sleeper, which becomes the watcher. */
        atomic_store(&g_gate.watcher, 0);
        if (left > 0) gate_wake_one(0);
    }
    return 1;
}

static void gate_exit(void) {
    long long t = gate_now();
    atomic_store(&g_gate.released_ns, t);
    atomic_store(&g_gate.held, 0);
    /* A claimant is spinning: it is in now (gate_may_take lets only it pass). Otherwise, once
     * our interval is over and others wait, wake one to claim (again if a wake went unclaimed). */
    if (atomic_load(&g_gate.claim) == 0 && atomic_load(&g_gate.waiters) > 0) {
        long long wait = atomic_load_explicit(&g_gate.wait_ns, memory_order_relaxed);
        if (t - atomic_load(&g_gate.owner_since) >= wait && t - atomic_load(&g_gate.wake_sent_ns) >= CB_GATE_CLAIM_NS) {
            atomic_store(&g_gate.wake_sent_ns, t);
            atomic_fetch_add_explicit(&g_gate.handoffs, 1, memory_order_relaxed);
            gate_wake_one(1);
        }
    }
}

#endif
