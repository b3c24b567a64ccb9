"""Writes docs/architecture.svg, the picture of the layers in docs/architecture.md.

Plain SVG text, boxes and arrows, from the standard library only (no graphviz):

    python docs/architecture_diagram.py           # (re)writes docs/architecture.svg
    python docs/architecture_diagram.py --check   # exits 1 if the committed SVG is not what this writes

Edit the LAYERS / EDGES tables below, run it, and commit both files.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent / "architecture.svg"

WIDTH = 980
FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""

# Fill colour per language.
COLOURS = {
    "Java": "#fde9d9",
    "C": "#e2ecf9",
    "Python": "#e3f4e1",
    "C or Python": "#eef3dc",
}

# (key, x, y, w, h, language, title, lines): the boxes.
BOXES = [
    ("plugin", 40, 50, 430, 92, "Java", "Spark plugin  (jvm/src/spark/java/org/cudabridge/spark)",
     ["CudaBridgePlugin: DriverPlugin + ExecutorPlugin", "CudaBridgeExecutorPlugin: init, onTaskStart,",
      "onTaskSucceeded / onTaskFailed, shutdown; BridgeMetrics"]),
    ("executor", 510, 50, 430, 92, "Java", "Executor glue, no Spark class  (org.cudabridge.executor)",
     ["TaskBinder: start, bind, release, statistics", "TaskReleaser + LifecycleThread: binds ahead, batched",
      "releases; ExecutorCounters, ExecutorStatistics; GpuTask"]),
    ("api", 40, 178, 900, 78, "Java", "Java API  (jvm/src/main/java/org/cudabridge)",
     ["CudaBridge (front) over Launcher, TaskTable + TaskScope, DeviceMemory + DeviceBuffer, BridgeStatistics;",
      "NativeBridge: the JNI natives; ControlPlane: the JPype proxy's interface"]),
    ("jni", 40, 292, 470, 92, "C", "JNI bridge  (bridge/cudabridge_jni.c, bridge/hot_gate.h)",
     ["hosts CPython in the JVM; per call: the gate (short calls),",
      "the thread's kept Python thread state and the GIL, one",
      "PyObject_Vectorcall, GIL dropped, then any Java exception"]),
    ("control", 640, 292, 300, 92, "Python", "Control path  (python/cudabridge/jvm)",
     ["bootstrap.py: start(); control.py:", "BridgeControl: native_bind,", "native_release_many, statistics"]),
    ("hot", 40, 420, 470, 78, "C or Python", "Java hot path  (python/cudabridge/jvm)",
     ["JavaHotPath (hot_path.py), or its C twin HotCore",
      "(_hotcore.c) for stream, allocate, free, free_many"]),
    ("service", 40, 534, 900, 104, "Python", "Service  (python/cudabridge)",
     ["CudaBridgeService (service.py): one StreamPool (stream_pool.py) and one StreamOrderedMemoryPool per GPU,",
      "TaskRegistry (task_registry.py): task attempt -> (GPU, stream), task leases, release of leaks.",
      "Memory pool (memory/): fast path in C (FastPath, _fastpath.c) or Python (python_fast_path.py)",
      "-> stream-ordering core (stream_ordering.py) -> upstream (upstream.py, segment_growth.py)"]),
    ("cuda", 40, 674, 430, 56, "Python", "cuda backend  (device/cuda_backend.py)",
     ["the real GPU through cuda-python (cuda.bindings)"]),
    ("emulated", 510, 674, 430, 56, "Python", "emulated backend  (device/emulated_backend.py)",
     ["a CPU model: ordered stream queues, events, race checks"]),
]

# (from, to, label, dashed, from side, to side, label side): the arrows. Sides: "b" bottom, "t" top,
# "r", "l", optionally with a fraction along the side after a colon ("b:0.3"); the label goes
# right ("r") or left ("l") of a vertical arrow, above a horizontal one; "\n" breaks it.
EDGES = [
    ("plugin", "executor", "hooks", False, "r", "l", "r"),
    ("executor", "api", "CudaBridge.start,\nbindTaskDeferred, releaseTasks", False, "b:0.5", "t:0.78", "l"),
    ("plugin", "api", "task code: GpuTask.bridge()", False, "b:0.5", "t:0.24", "r"),
    ("api", "jni", "JNI natives (NativeBridge)", False, "b:0.26", "t:0.5", "r"),
    ("api", "control", "JPype proxy: statistics,\ndeviceError, shutdown", True, "b:0.833", "t:0.5", "l"),
    ("jni", "hot", "allocate, free, stream, copies", False, "b:0.5", "t:0.5", "r"),
    ("jni", "control", "bindTask,\nreleaseTasks", False, "r", "l", "r"),
    ("control", "service", "bind, release,\nstatistics", False, "b:0.5", "t:0.833", "r"),
    ("hot", "service", "task lease; the pool's allocate / free", False, "b:0.5", "t:0.261", "r"),
    ("service", "cuda", "malloc, streams, events", False, "b:0.24", "t:0.5", "r"),
    ("service", "emulated", "the same DeviceBackend calls", False, "b:0.76", "t:0.5", "r"),
]


def _anchor(box: tuple, side: str) -> tuple[float, float]:
    _key, x, y, w, h = box[:5]
    where, _, frac = side.partition(":")
    f = float(frac) if frac else 0.5
    if where == "b":
        return x + w * f, y + h
    if where == "t":
        return x + w * f, y
    if where == "r":
        return x + w, y + h * f
    return x, y + h * f


def render() -> str:
    height = max(b[2] + b[4] for b in BOXES) + 70
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}">',
        "<title>spark-cuda-bridge: the layers</title>",
        "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"8\" "
        "markerHeight=\"8\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#333\"/>"
        "</marker></defs>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="40" y="30" {FONT} font-size="17" font-weight="bold">spark-cuda-bridge: one executor JVM, '
        f'top to bottom</text>',
    ]
    for _key, x, y, w, h, lang, title, lines in BOXES:
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{COLOURS[lang]}" '
                   f'stroke="#555" stroke-width="1.2"/>')
        out.append(f'<text x="{x + 10}" y="{y + 19}" {FONT} font-size="13" font-weight="bold">'
                   f'{escape(title)}</text>')
        out.append(f'<text x="{x + w - 8}" y="{y + h - 7}" {FONT} font-size="10" fill="#777" '
                   f'text-anchor="end">{escape(lang)}</text>')
        for i, line in enumerate(lines):
            out.append(f'<text x="{x + 10}" y="{y + 38 + 16 * i}" {FONT} font-size="12">{escape(line)}</text>')
    boxes = {b[0]: b for b in BOXES}
    for src, dst, label, dashed, s_side, d_side, l_side in EDGES:
        x1, y1 = _anchor(boxes[src], s_side)
        x2, y2 = _anchor(boxes[dst], d_side)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        out.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="#333" '
                   f'stroke-width="1.4"{dash} marker-end="url(#arrow)"/>')
        parts = label.split("\n") if label else []
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        for i, part in enumerate(parts):
            if y1 == y2:   # a horizontal arrow: the label above it
                ty = my - 6 - 13 * (len(parts) - 1 - i)
                attrs = f'x="{mx:.0f}" y="{ty:.0f}" text-anchor="middle"'
            else:
                ty = my + 4 + 13 * (i - (len(parts) - 1) / 2)
                tx, anchor = (mx + 6, "start") if l_side == "r" else (mx - 6, "end")
                attrs = f'x="{tx:.0f}" y="{ty:.0f}" text-anchor="{anchor}"'
            out.append(f'<text {attrs} {FONT} font-size="11" fill="#222">{escape(part)}</text>')
    ly = height - 34
    out.append(f'<text x="40" y="{ly}" {FONT} font-size="11" fill="#444">Fill (and the word in each box\'s '
               f'corner): the language of the layer. Solid arrows: the hot path and the task lifecycle.</text>')
    out.append(f'<text x="40" y="{ly + 15}" {FONT} font-size="11" fill="#444">Dashed: the JPype control '
               f'path (one proxy call per statistics snapshot, device probe or shutdown).</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    svg = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != svg:
            print(f"{OUT} is not what {Path(__file__).name} writes: run it and commit the SVG", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(svg)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
