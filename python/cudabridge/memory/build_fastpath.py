"""``python -m cudabridge.memory.build_fastpath [--force]``: compile the service's three C
extensions in place with gcc (no setuptools), for a machine with a compiler and a Python but no
package index; an install builds them with setup.py."""

import sys

from .native import EXTENSIONS, PACKAGE_DIR, build

if __name__ == "__main__":
    force = "--force" in sys.argv
    for c_path in EXTENSIONS.values():
        print(build(force=force, source=PACKAGE_DIR / c_path.source))
