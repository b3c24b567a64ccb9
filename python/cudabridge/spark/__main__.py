"""``python -m cudabridge.spark``: ``build`` (bridge, core jar, plugin jar, examples jar),
``classpath`` (for ``spark.{driver,executor}.extraClassPath``), ``jars`` (for ``--jars``), ``plugin-jar``, ``examples-jar``,
``spark-submit`` (its path), ``submit-conf`` (the ``--conf`` arguments, one per line)."""

from __future__ import annotations

import argparse
import logging
import sys

from . import build as b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cudabridge.spark", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    bp = sub.add_parser("build", help="build the bridge, the core jar, the plugin jar and the examples jar")
    bp.add_argument("--force", action="store_true")
    bp.add_argument("--no-examples", action="store_true")
    for name in ("classpath", "jars", "plugin-jar", "examples-jar", "spark-submit", "submit-conf"):
        sub.add_parser(name)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "build":
            for kind, path in b.build(force=args.force, examples=not args.no_examples).items():
                print(f"{kind:9} {path}")
        elif args.command == "classpath":
            print(b.classpath())
        elif args.command == "jars":
            print(b.jars())
        elif args.command == "plugin-jar":
            print(b.plugin_jar_path())
        elif args.command == "examples-jar":
            print(b.examples_jar_path())
        elif args.command == "spark-submit":
            print(b.spark_submit())
        else:
            print("\n".join(b.submit_conf()))
        return 0
    except b.core.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
