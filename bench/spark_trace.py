"""A seeded, Spark-like allocation trace: many short tasks on 4-32 streams, 256 B to 256 MiB.

Parameters are fixed here so that every run, on every allocator, replays the same events.
Sizes are log-uniform (most buffers small, a few huge), tasks overlap (a bounded number run at
once, like an executor's task slots), and a task frees its buffers in random order, part
during the task and the rest at its end.
"""

from __future__ import annotations

import math
import random

SEED = 20261202
TASKS = 600
CONCURRENT_TASKS = 16
STREAMS = 24                     # within the 4-32 the issue names
BUFFERS_PER_TASK = (4, 24)
MIN_SIZE, MAX_SIZE = 256, 256 << 20


def generate(seed: int = SEED) -> list[tuple]:
    """Events: ("alloc", id, size, stream_index) and ("free", id)."""
    rng = random.Random(seed)
    lo, hi = math.log(MIN_SIZE), math.log(MAX_SIZE)
    events: list[tuple] = []
    running: list[dict] = []
    next_id = 0
    started = 0
    while started < TASKS or running:
        if started < TASKS and len(running) < CONCURRENT_TASKS:
            running.append({"stream": rng.randrange(STREAMS), "live": [], "left": rng.randint(*BUFFERS_PER_TASK)})
            started += 1
            continue
        task = rng.choice(running)
        if task["left"] and (not task["live"] or rng.random() < 0.65):
            size = int(math.exp(rng.uniform(lo, hi)))
            events.append(("alloc", next_id, size, task["stream"]))
            task["live"].append(next_id)
            next_id += 1
            task["left"] -= 1
        elif task["live"]:
            events.append(("free", task["live"].pop(rng.randrange(len(task["live"])))))
        if not task["left"] and (not task["live"] or rng.random() < 0.3):
            rng.shuffle(task["live"])
            events.extend(("free", i) for i in task["live"])  # task end
            running.remove(task)
    return events


def peak_requested(events: list[tuple]) -> int:
    live: dict[int, int] = {}
    cur = peak = 0
    for ev in events:
        if ev[0] == "alloc":
            live[ev[1]] = ev[2]
            cur += ev[2]
            peak = max(peak, cur)
        else:
            cur -= live.pop(ev[1])
    return peak
