"""One device->host copy of 1 MiB on the emulated device, two ways: the calls the C staging ring
makes through the emulated driver table (device/emulated_driver.py: context, slot event query, the
DMA into a page-locked slot, event record, event wait, then the slot's bytes copied out), and the
backend's own copy into pageable memory (the Python shortcut Java's copies took before the table).
What it shows: where the emulated device's Java device->host copy spends its time on the C path.

    python bench/emulated_copy_probe.py [--n 300] [--bytes 1048576]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time

os.environ.setdefault("CUDABRIDGE_EMULATED_RACE_CHECK", "1")   # as the tests and the JVM bench run it

from cudabridge.device import EmulatedBackend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--bytes", type=int, default=1 << 20)
    args = ap.parse_args()
    n = args.bytes
    be = EmulatedBackend(devices=1, memory_bytes=max(256 << 20, 4 * n), race_check=True)
    t = be.native_driver._table
    s = be.stream_create()
    dev = be.malloc(n)
    slot = be.alloc_pinned(n)
    host = bytearray(n)
    event = ctypes.c_void_p()
    assert t.cuEventCreate(ctypes.byref(event), 2) == 0
    ctx = ctypes.c_void_p()
    out = (ctypes.c_char * n).from_buffer(host)

    def table_without_copy_out() -> None:
        t.cuCtxGetCurrent(ctypes.byref(ctx))
        t.cuEventQuery(event)
        t.cuMemcpyDtoHAsync(ctypes.addressof(slot), dev, n, s)
        t.cuEventRecord(event, s)
        t.cuEventSynchronize(event)

    def table() -> None:
        table_without_copy_out()
        ctypes.memmove(out, slot, n)

    def pageable() -> None:
        be.copy_from_device_async(host, dev, s)

    ways = (table, table_without_copy_out, pageable)
    times: dict[str, list[float]] = {f.__name__: [] for f in ways}
    for rnd in range(4):   # interleaved rounds; the first is a warm-up
        for f in ways:
            t0 = time.perf_counter()
            for _ in range(args.n):
                f()
            if rnd:
                times[f.__name__].append((time.perf_counter() - t0) / args.n * 1e6)
    for name, v in times.items():
        print(f"{name:24s} {min(v):8.1f} - {max(v):8.1f} us per {n} bytes")
    be.close()


if __name__ == "__main__":
    main()
