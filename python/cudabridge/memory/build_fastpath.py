"""``python -m cudabridge.memory.build_fastpath [--force]``: build the pool's C fast path."""

import sys

from .native import build

if __name__ == "__main__":
    print(build(force="--force" in sys.argv))
