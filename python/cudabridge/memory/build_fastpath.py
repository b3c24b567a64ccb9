"""``python -m cudabridge.memory.build_fastpath [--force]``: compile the service's C
extensions (native.EXTENSIONS) and the allocator plug-ins' compiled parts in place with gcc and g++ (no setuptools),
for a machine with a compiler and a Python but no package index; an install builds them with
setup.py."""

import sys

from .native import ALLOCATOR_PARTS, EXTENSIONS, PACKAGE_DIR, build

if __name__ == "__main__":
    force = "--force" in sys.argv
    for c_path in (*EXTENSIONS.values(), *ALLOCATOR_PARTS.values()):
        print(build(force=force, source=PACKAGE_DIR / c_path.source))
