"""``python -m cudabridge``: ``demo`` (many concurrent simulated tasks through the service),
``info`` (backend and devices), ``config`` (every configuration key with its default), and for the
JVM bridge ``build`` (the JNI library and the jar), ``jar`` and ``classpath`` (what spark-submit
needs); ``doctor`` checks what a new machine has and lacks (:mod:`cudabridge.doctor`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudabridge")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run many concurrent simulated Spark tasks through the service")
    demo.add_argument("--tasks", type=int, default=400)
    demo.add_argument("--threads", type=int, default=16)
    demo.add_argument("--backend", default=None, help="auto | cuda | emulated (default: spark.cudabridge.backend or auto)")
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--json", action="store_true", help="print the statistics as JSON")
    sub.add_parser("info", help="say which backend 'auto' picks and what devices it sees")
    cfg = sub.add_parser("config", help="list every setting (settings.json) with its default")
    cfg.add_argument("--markdown", action="store_true", help="the tables of docs/configuration.md")
    build = sub.add_parser("build", help="build the JVM bridge: the JNI library (gcc) and the jar (javac)")
    build.add_argument("--native-only", action="store_true",
                       help="only the library (where there is a Java runtime with include/jni.h but no javac)")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    sub.add_parser("jar", help="print the path of cudabridge.jar")
    sub.add_parser("classpath", help="print the class path for spark.{driver,executor}.extraClassPath")
    doctor = sub.add_parser("doctor", help="check this machine: Python, JPype, the bridge library, C fast paths, "
                                           "jars, the device and pinned memory (exit 1 if something is missing)")
    doctor.add_argument("--backend", choices=("auto", "cuda", "emulated"), default=None,
                        help="the backend to check for (default: spark.cudabridge.backend from CUDABRIDGE_BACKEND, "
                             "else auto)")
    doctor.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(args)
    if args.command in ("build", "jar", "classpath"):
        return _jvm_command(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.command == "config":
        from .config import SCOPES, SETTINGS, markdown_table

        if args.markdown:
            for scope in SCOPES:
                print(f"<!-- settings:{scope} -->\n{markdown_table(scope)}\n<!-- /settings:{scope} -->\n")
            return 0
        for s in SETTINGS:
            default = s.default if s.default is not None else f"({s.default_doc})"
            print(f"{s.name} = {default}  [{s.scope}{', test' if s.test else ''}] {s.doc}")
        return 0
    if args.command == "info":
        from .device import gpu_visible, open_backend

        visible, why = gpu_visible()
        backend = open_backend("auto")
        print(f"backend: {backend.name} ({why})")
        for i in range(backend.device_count()):
            backend.set_device(i)
            free, total = backend.mem_get_info()
            print(f"  GPU {i}: {backend.device_uuid(i)}  {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
        backend.close()
        return 0

    from .config import ServiceConfig
    from .demo import run_demo

    config = ServiceConfig.from_env()
    if args.backend:
        config = dataclasses.replace(config, backend=args.backend)
    result = run_demo(config, tasks=args.tasks, threads=args.threads, seed=args.seed)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0 if result["verify_failures"] == 0 and result["live_allocations_after"] == 0 else 1


def _jvm_command(args: argparse.Namespace) -> int:
    from .jvm import build as jvm_build

    try:
        if args.command == "build":
            logging.getLogger().setLevel(logging.WARNING)
            for kind, path in jvm_build.build(native_only=args.native_only, force=args.force).items():
                print(f"{kind:8} {path}")
            return 0
        path = jvm_build.jar_path()
        if not path.is_file():
            raise jvm_build.BuildError(f"{path} is not built: run python -m cudabridge build")
        print(path if args.command == "jar" else jvm_build.classpath())
        return 0
    except jvm_build.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
