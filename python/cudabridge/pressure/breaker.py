"""The deadlock breaker: which waiting task fails, if any, so that the others proceed.

A pure function of one snapshot, so that it can be tested over any wait graph (tests/
test_memory_pressure.py runs hypothesis over random ones). Its inputs:

* ``holders``: task -> bytes it holds on the GPU (its live allocations there);
* ``waits``: the registered waits on the GPU (waits.py), each with its task and kind;
* ``running``: tasks with a thread inside one of their operations that is not a registered wait
  (a copy, a launch, a Python function running);
* ``order``: task -> bind order (larger: bound later, younger);
* ``entering``: the Java threads inside bridge calls of tasks, from before they wait for the gate
  and the GIL until they leave the call, not waiting for memory (bridge/entry_waits.h), each as its
  call's task, or None where that is unknown (a batch of frees or releases). Such a thread is in an
  operation that may give memory back: its task counts as running, and an unknown one as possibly
  any holder's.

A task *holds memory* when ``holders`` says so; it is *blocked* when it has a registered wait and
is not running. The breaker acts only when every task holding memory on the GPU is blocked and
some task waits for an allocation there: then nothing will come back by waiting (frees come from
tasks that run). It fails the allocation of the **youngest** blocked task that holds memory and
waits for an allocation (the latest bound: it has done the least work, and Spark retries it as a
new attempt; its release gives back what it holds). A waiting task that holds nothing while no
task holds memory at all is failed too: nothing it could wait for exists. Never otherwise: while
any task holding memory runs, its frees or its release may let the waiters through.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .waits import ALLOCATION, Wait


def victim(holders: Mapping[int, int], waits: Iterable[Wait], running: Iterable[int],
           order: Mapping[int, int], entering: Iterable[int | None] = ()) -> tuple[int, str] | None:
    """(the task whose waiting allocation fails now, the reason: ``"breaker"``, or ``"too_large"``
    when no task holds memory at all), or None (the module docstring's rule)."""
    waits = list(waits)
    alloc_waiters = {w.task for w in waits if w.kind == ALLOCATION}
    if not alloc_waiters:
        return None
    entering = list(entering)
    run = set(running) | {t for t in entering if t is not None}
    held = {t for t, n in holders.items() if n > 0}
    waiting = {w.task for w in waits}
    if not held:
        # nothing held by any task: no release can help; the oldest waiter's failure is reported first
        return min(alloc_waiters, key=lambda t: (order.get(t, 0), t)), "too_large"
    if any(t in run or t not in waiting for t in held):
        return None   # a holder runs (or is between operations): its frees may come
    if None in entering:
        return None   # a thread of no known task is entering: it may be a holder's, on its way to a free
    candidates = held & alloc_waiters
    if not candidates:
        return None   # holders wait for admission only: the admitted ones hold nothing (cannot happen), wait
    return max(candidates, key=lambda t: (order.get(t, 0), t)), "breaker"
