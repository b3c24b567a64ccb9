"""One name per quantity (docs/glossary.md): the statistics' names are one derived list, the
glossary names each of them, and the out-of-memory fields and release reports use the same names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cudabridge.config import ServiceConfig
from cudabridge.errors import OutOfDeviceMemory
from cudabridge.jvm.control import BridgeControl
from cudabridge.jvm.hot_path import JavaHotPath
from cudabridge.memory import PoolStatistics
from cudabridge.service import CudaBridgeService
from cudabridge.task_registry import ReleaseReport

GLOSSARY = Path(__file__).resolve().parent.parent / "docs" / "glossary.md"


def test_statistics_hold_exactly_the_named_list():
    svc = CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="64m", pool_limit="32m",
                                          streams_per_gpu=2, high_priority_streams=0, log_level="WARNING"))
    try:
        control = BridgeControl(svc, JavaHotPath(svc), {})
        assert tuple(control.statistics()) == BridgeControl.statistics_names()
    finally:
        svc.close()


def test_the_glossary_names_every_statistic():
    text = GLOSSARY.read_text()
    missing = [n for n in BridgeControl.statistics_names() if f"`{n}`" not in text]
    assert not missing, f"docs/glossary.md does not name {missing}"


def test_out_of_memory_fields_are_statistics_names():
    stats = {f.name for f in dataclasses.fields(PoolStatistics)}
    assert set(OutOfDeviceMemory.FIELDS) - stats == {"requested_bytes", "reason"}
    e = OutOfDeviceMemory(*range(1, 8), reason="timeout")
    assert e.values() == (*range(1, 8), OutOfDeviceMemory.REASONS.index("timeout"))
    assert [getattr(e, f) for f in OutOfDeviceMemory.FIELDS] == [*range(1, 8), "timeout"]
    assert "waited oomWait" in str(e)
    import pickle

    again = pickle.loads(pickle.dumps(e))
    assert again.values() == e.values() and str(again) == str(e)


def test_release_reports_count_leaks_as_the_pool_does():
    names = list(ReleaseReport._fields)
    assert names[1:] == ["leaks_reclaimed", "leaked_bytes_reclaimed"]
    assert set(names[1:]) <= set(PoolStatistics.COUNTERS)
