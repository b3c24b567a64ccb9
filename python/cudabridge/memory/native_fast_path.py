"""Install the C fast paths (``FastPath`` in _fastpath.c) as a pool's ``allocate`` / ``free``.

Only the default composition runs them (the default arena type): the C code follows
python_fast_path.py for exactly that. It gets the pool's :class:`FastPathHooks` and nothing
else, and the pool's locked steps run on a :class:`SerialWorker` (memory/serial_worker.h), where no
signal handler or async exception can interrupt one half done.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument
from .allocation import ALIVE, FREED, Allocation
from .block import LIVE, Block
from .fast_path_hooks import FastPathHooks
from .native import load as load_native
from .native import supported as native_supported
from .stream_arena import StreamArena


def native_fast_path(hooks: FastPathHooks, *, stream_query, cu_stream_query: int, required: bool) -> Any | None:
    """A C ``FastPath`` over ``hooks`` and its ``SerialWorker`` (``.worker``), or None where the
    extension is not built (``required``: raise InvalidArgument instead, saying why)."""
    module = load_native()
    if module is None:
        if required:
            ok, why = native_supported()
            raise InvalidArgument("fast_path='native' but the C extension is unavailable: "
                                  + (why or "not built (python -m cudabridge.memory.build_fastpath)"))
        return None
    if not (issubclass(Allocation, module.AllocationBase) and issubclass(Block, module.BlockBase)
            and issubclass(StreamArena, module.ArenaBase)):
        if required:
            raise InvalidArgument("fast_path='native': the pool's classes were defined before the extension was built")
        return None
    return module.FastPath(hooks, module.SerialWorker(), alloc_type=Allocation, live_state=LIVE, alive=ALIVE,
                           freed=FREED, first_id=1, stream_query=stream_query, cu_stream_query=cu_stream_query)
