"""``python -m cudabridge.memory.build_fastpath [--force]``: build the service's C fast paths:
the pool's (``memory/_fastpath.c``), the task registry's (``_registry_core.c``) and the Java
hot path's (``jvm/_hotcore.c``)."""

import sys

from .native import HERE, build

if __name__ == "__main__":
    force = "--force" in sys.argv
    print(build(force=force))
    print(build(force=force, source=HERE.parent / "_registry_core.c"))
    print(build(force=force, source=HERE.parent / "jvm" / "_hotcore.c"))
