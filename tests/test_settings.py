"""The settings table (python/cudabridge/settings.json) is the one definition: the tables of
docs/configuration.md are generated from it, every key the README and docs/*.md mention is in it,
every mode list's enum matches it, and values are checked by its types."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cudabridge import config
from cudabridge.config import SETTINGS, SPARK_KEYS, check_value, markdown_table
from cudabridge.device import Backend
from cudabridge.errors import InvalidArgument
from cudabridge.memory import PoolGrowth
from cudabridge.stream_pool import Priority, StreamPolicy

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATION = ROOT / "docs" / "configuration.md"   # the page with the generated tables
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _block(scope: str) -> re.Pattern:
    return re.compile(rf"<!-- settings:{scope} -->\n(.*?)\n<!-- /settings:{scope} -->", re.S)


@pytest.mark.parametrize("scope", config.SCOPES)
def test_the_configuration_tables_are_the_settings_table(scope):
    text = CONFIGURATION.read_text()
    m = _block(scope).search(text)
    assert m, f"docs/configuration.md has no <!-- settings:{scope} --> block"
    assert m.group(1) == markdown_table(scope), (
        "docs/configuration.md and settings.json differ: paste `python -m cudabridge config --markdown` "
        "into docs/configuration.md")


@pytest.mark.parametrize("scope", config.SCOPES)
def test_no_other_page_has_a_stale_copy_of_a_table(scope):
    for page in PAGES:
        for m in _block(scope).finditer(page.read_text()):
            assert m.group(1) == markdown_table(scope), (
                f"{page.relative_to(ROOT)}'s <!-- settings:{scope} --> block differs from settings.json")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_key_the_docs_name_is_in_the_table(page):
    text = page.read_text()
    named = set(re.findall(r"spark\.cudabridge\.[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)*", text))
    named -= {"spark.cudabridge.poolLimt"}   # docs/configuration.md's own example of a misspelled key
    unknown = sorted(k for k in named if k not in SPARK_KEYS)
    assert not unknown, f"{page.relative_to(ROOT)} names keys the table does not have: {unknown}"
    props = set(re.findall(r"-D(cudabridge\.[A-Za-z.]+[A-Za-z])", text))
    jvm = {s.key for s in SETTINGS if s.scope == "jvm"}
    assert props <= jvm, (
        f"{page.relative_to(ROOT)} names JVM properties the table does not have: {sorted(props - jvm)}")


def test_the_pages_are_found():
    names = {p.name for p in PAGES}
    assert {"README.md", "configuration.md"} <= names, names


@pytest.mark.parametrize("key,enum", [("streamPolicy", StreamPolicy), ("taskPriority", Priority),
                                      ("poolGrowth", PoolGrowth), ("backend", Backend)])
def test_mode_enums_are_the_tables_values(key, enum):
    assert tuple(m.value for m in enum) == config.BY_KEY[key].values


def test_spellings_are_derived():
    s = config.BY_KEY["poolLimit"]
    assert (s.spark_key, s.env_name, s.field) == ("spark.cudabridge.poolLimit", "CUDABRIDGE_POOL_LIMIT", "pool_limit")
    s = config.BY_KEY["metrics.refreshMs"]
    assert (s.spark_key, s.env_name) == ("spark.cudabridge.metrics.refreshMs", "CUDABRIDGE_METRICS_REFRESH_MS")
    assert config.BY_KEY["nativeFastPath"].env_name == "CUDABRIDGE_NATIVE_FAST_PATH"
    assert config.BY_KEY["emulatedRaceCheck"].env_name == "CUDABRIDGE_EMULATED_RACE_CHECK"
    assert config.BY_KEY["cudabridge.gate.holdMicros"].spark_key is None
    for s in SETTINGS:   # every default passes its own check
        assert check_value(s.key, s.default) is not None or s.default is None


def test_environment_names_in_the_code_are_the_tables():
    from cudabridge.device import emulated_backend
    from cudabridge.memory import native

    assert emulated_backend.RACE_CHECK_ENV == config.BY_KEY["emulatedRaceCheck"].env_name
    assert native.ENV_SWITCH == config.BY_KEY["nativeFastPath"].env_name


# (key, value, accepted): the Java side (tests/test_settings_java.py) checks the same cases
CASES = [
    ("streamsPerGpu", "32", True), ("streamsPerGpu", "0", False), ("streamsPerGpu", "1025", False),
    ("streamsPerGpu", "eight", False), ("streamsPerGpu", "1.0", False),
    ("logLevel", "debug", True), ("logLevel", "LOUD", False), ("backend", "Cuda", False), ("backend", "cuda", True),
    ("poolLimit", "0.9", True), ("poolLimit", "1.0", True), ("poolLimit", "1", False), ("poolLimit", "255", False),
    ("poolLimit", "2m", True), ("poolLimit", "2097151", False), ("poolLimit", "1.5", False),
    ("poolLimit", str(1 << 63), False), ("poolLimit", "8g", True), ("poolLimit", "lots", False),
    ("poolInitial", "0", True), ("poolInitial", "-1", False), ("emulatedMemory", "1m", False),
    ("emulatedMemory", "16g", True), ("emulatedMemory", "16q", False),
    ("hostWaitTimeout", "0.5", True), ("hostWaitTimeout", "0", False), ("hostWaitTimeout", "inf", False),
    ("hostWaitTimeout", "nan", False), ("asyncRelease", "TRUE", True), ("asyncRelease", "yes", False),
    ("taskBind", "ahead", True), ("taskBind", "later", False), ("reportIntervalMs", "0", True),
    ("reportIntervalMs", "-1", False), ("gpuAddresses", "0,1", True),
]


@pytest.mark.parametrize("key,value,ok", CASES)
def test_values_are_checked_by_type(key, value, ok):
    if ok:
        check_value(key, value)
    else:
        with pytest.raises(InvalidArgument, match=re.escape(config.BY_KEY[key].name)):
            check_value(key, value)


def test_a_staging_ring_larger_than_the_pinned_pool_is_refused():
    """A staging ring is one block of the pinned pool: stagingSlots x stagingSlotBytes above a
    non-zero pinnedPool could never come from it, and is refused naming the three keys."""
    from cudabridge.config import ServiceConfig

    with pytest.raises(InvalidArgument, match="stagingSlots x .*stagingSlotBytes .*pinnedPool"):
        ServiceConfig(pinned_pool="8m")                          # the default ring: 4 x 4 MiB
    with pytest.raises(InvalidArgument, match="pinnedPool"):
        ServiceConfig.from_mapping({"spark.cudabridge.pinnedPool": "16m", "spark.cudabridge.stagingSlots": "5"})
    assert ServiceConfig(pinned_pool="16m").staging_slots == 4   # exactly one ring: fine
    assert ServiceConfig(pinned_pool="0").pinned_pool == "0"     # no pool: rings allocate their own
    assert ServiceConfig(pinned_pool="1m", staging_slots=2, staging_slot_bytes="512k").pinned_pool == "1m"
