"""16+ threads of random allocate / write / verify / free / task-end on shared pools.

Invariants: no live block is handed out twice (no two live allocations overlap), data written
on a task's stream is read back intact even though frees never wait, bytes are conserved, and
after every task has ended every byte is back in the pool."""

import random
import threading

import pytest
from device_kernels import fill_u32_async

from cudabridge import CudaBridgeService, ServiceConfig

THREADS = 16
TASKS_PER_THREAD = 12
SIZES = (256, 1000, 4096, 65536, 300_000, 1 << 20, 3 << 20)


class LiveRanges:
    """Every live allocation's byte range, checked for overlap on each allocate."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ranges: dict[int, tuple[int, int]] = {}
        self.overlaps = []

    def add(self, a):
        lo, hi = a.ptr, a.ptr + a.size
        with self.lock:
            for other_id, (olo, ohi) in self.ranges.items():
                if lo < ohi and olo < hi:
                    self.overlaps.append((a.id, other_id))
            self.ranges[a.id] = (lo, hi)

    def remove(self, a):
        with self.lock:
            del self.ranges[a.id]


def _worker(service, thread_no, live, failures, errors, limit_hit):
    backend = service.backend
    rng = random.Random(1000 + thread_no)
    try:
        for t in range(TASKS_PER_THREAD):
            task = thread_no * 1000 + t
            binding = service.bind_task(task)
            service.registry.attach(task)
            stream = binding.stream
            pending = []   # (alloc, host buffer, expected) freed before their copy completed
            held = []
            for _ in range(rng.randint(3, 10)):
                size = rng.choice(SIZES)
                try:
                    a = service.allocate(task, size)
                except MemoryError:
                    limit_hit.append(task)
                    continue
                live.add(a)
                value = rng.getrandbits(32)
                words = size // 4
                fill_u32_async(backend, a.ptr, words, value, stream, delay_s=rng.choice((0, 0, 0.002)))
                host = backend.alloc_pinned(4 * words)  # pinned: the copy stays in flight
                backend.copy_from_device_async(host, a.ptr, stream)
                expected = value.to_bytes(4, "little") * words
                if rng.random() < 0.6:
                    live.remove(a)
                    a.free()           # never waits: the copy above is still in flight
                    pending.append((host, expected))
                else:
                    held.append((a, host, expected))
            backend.stream_synchronize(stream)
            for host, expected in pending + [(h, e) for _, h, e in held]:
                if bytes(host) != expected:
                    failures.append(task)
                backend.free_pinned(host)
            n_leak = rng.randint(0, len(held))
            for i, (a, _host, _expected) in enumerate(held):
                live.remove(a)
                if i >= n_leak:
                    a.free()
                # else: leaked on purpose; task end reclaims it
            leak = held[:n_leak]
            report = service.release_task(task)
            assert report.leaks_reclaimed == len(leak)
            service.registry.detach()
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("limit", ["4g", "24m"], ids=["roomy", "tight"])
def test_threads_share_pools_without_corruption(limit):
    config = ServiceConfig(backend="emulated", streams_per_gpu=8, high_priority_streams=0,
                           pool_limit=limit, emulated_memory="8g")
    with CudaBridgeService(config) as service:
        live = LiveRanges()
        failures, errors, limit_hit = [], [], []
        threads = [threading.Thread(target=_worker, args=(service, i, live, failures, errors, limit_hit))
                   for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        assert not live.overlaps, live.overlaps[:5]
        assert not failures, f"data corrupted in tasks {failures[:10]}"
        stats = service.memory_pool(0).statistics()
        assert stats.live_allocations == 0
        assert stats.in_use_bytes == 0
        assert stats.free_safe_bytes + stats.free_in_streams_bytes + stats.free_pending_bytes + stats.spare_bytes \
            == stats.reserved_bytes
        assert stats.reserved_bytes <= service.memory_pool(0).limit
        assert service.registry.tasks_bound == 0
        print(stats, len(limit_hit))
        assert stats.leaks_reclaimed > 0
        if limit == "24m":
            # 16 threads on 8 streams in 24 MiB: cross-stream reuse had to happen
            assert stats.event_polls + stats.stream_polls > 0
