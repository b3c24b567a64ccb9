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


def test_the_pinned_pool_and_staging_are_sized_apart():
    """Staging has its own reservation (stagingCopies x stagingSlotBytes per GPU), so a pinned pool
    smaller than what one copy stages through is fine; the staging keys are bounded on their own."""
    from cudabridge.config import ServiceConfig

    assert ServiceConfig(pinned_pool="1m").staging_slots == 4
    assert ServiceConfig(pinned_pool="0", staging_copies=16, staging_wait="0.5").staging_copies == 16
    for bad in ({"staging_copies": 0}, {"staging_copies": 1025}, {"staging_wait": "0"}, {"staging_wait": "-1"}):
        with pytest.raises(InvalidArgument, match="staging"):
            ServiceConfig(**bad)


# --- bounds (issue 23: 6.6, 6.13, 6.14) ------------------------------------------------------------------

def test_a_staging_slot_is_at_most_1_gib():
    """docs/configuration.md says "at most 1 GiB" and the C twin refuses more with an untyped
    ValueError that names no setting (jvm/_hotcore.c, enable_copies, on a GPU): the setting refuses
    it first, naming the key, what was given and what is allowed."""
    from cudabridge.config import ServiceConfig

    assert config.BY_KEY["stagingSlotBytes"].max == 1 << 30
    check_value("stagingSlotBytes", "1g")
    for given in ("1025m", "2g", "16g"):
        with pytest.raises(InvalidArgument, match=rf"spark\.cudabridge\.stagingSlotBytes='{given}': \d+ bytes is "
                                                  r"above the most accepted, 1073741824 \(1 GiB\)"):
            ServiceConfig(staging_slot_bytes=given, pinned_pool="0")
    assert ServiceConfig(staging_slot_bytes="1g", staging_slots=1, pinned_pool="1g").staging_slot_bytes == 1 << 30


def test_emulated_memory_is_at_most_the_emulated_address_window():
    """Each emulated GPU's addresses lie in a 1 TiB window of its own: with more memory (2t),
    GPU 1's buffers lay inside GPU 0's. The setting's bound is that window (one constant, the
    table's max, which the emulated backend takes), and the backend itself refuses more."""
    from cudabridge.device import emulated_backend
    from cudabridge.device.emulated_backend import EmulatedBackend

    assert emulated_backend._DEVICE_WINDOW == config.BY_KEY["emulatedMemory"].max == 1 << 40
    check_value("emulatedMemory", "1t")
    for given in ("1025g", "2t"):
        with pytest.raises(InvalidArgument, match=rf"spark\.cudabridge\.emulatedMemory='{given}': \d+ bytes is above "
                                                  r"the most accepted, 1099511627776 \(1 TiB\)"):
            check_value("emulatedMemory", given)
    with pytest.raises(InvalidArgument, match=r"memory_bytes=2199023255552: an emulated GPU has at most "
                                              r"1099511627776 bytes .*spark\.cudabridge\.emulatedMemory"):
        EmulatedBackend(devices=2, memory_bytes=2 << 40, race_check=False)
    EmulatedBackend(devices=2, memory_bytes=1 << 40, race_check=False).close()   # the window itself fits


@pytest.mark.parametrize("given, ok", [("0.0000001", False), ("1e-7", False), ("0.0000009", False),
                                       ("0.000001", True), ("0.1e-5", True), ("0.0001", True)])
def test_an_absurdly_small_pool_fraction_is_refused_at_configuration(given, ok):
    """poolLimit=0.0000001 gave a 256-byte pool in which every allocation failed. A fraction
    under 0.000001 gives less than 2 MiB on any GPU with under 1.9 TiB free: refused."""
    if "." not in given:
        given = "0" + given if given.startswith(".") else given
    if ok:
        check_value("poolLimit", given)
    elif "." in given:
        with pytest.raises(InvalidArgument, match=rf"spark\.cudabridge\.poolLimit='{re.escape(given)}': a fraction of "
                                                  r"free memory must be in \[0\.000001, 1\]"):
            check_value("poolLimit", given)
    else:   # no decimal point: bytes, and "1e-7" is not bytes
        with pytest.raises(InvalidArgument, match=r"spark\.cudabridge\.poolLimit"):
            check_value("poolLimit", given)


def test_a_pool_fraction_too_small_for_the_gpu_is_refused_at_start():
    """A fraction that is fine on a large GPU can give a tiny pool on a small one: the service
    refuses it at start, once each GPU's free memory is known, naming the key (on a 64 MiB
    emulated GPU, 0.01 is 655 KiB); a fraction that gives 2 MiB or more starts."""
    from cudabridge.config import ServiceConfig
    from cudabridge.service import CudaBridgeService

    small = ServiceConfig(backend="emulated", emulated_memory="64m", pool_limit="0.01", streams_per_gpu=1,
                          high_priority_streams=0)
    with pytest.raises(InvalidArgument, match=r"spark\.cudabridge\.poolLimit='0\.01': 0\.01 of GPU 0's free memory "
                                              r"is \d+ bytes, below the least a pool can use, 2097152 \(2 MiB\)"):
        CudaBridgeService(small)
    with CudaBridgeService(ServiceConfig(backend="emulated", emulated_memory="64m", pool_limit="0.05",
                                         streams_per_gpu=1, high_priority_streams=0)) as service:
        assert service.gpus[0].memory.limit >= config.MIN_LIMIT_BYTES


# --- the environment (issue 23: 6.7) ---------------------------------------------------------------------

@pytest.fixture
def clean_environment(monkeypatch):
    """No CUDABRIDGE_* variable but those a test sets (the suite's race check included)."""
    for name in [n for n in __import__("os").environ if n.startswith("CUDABRIDGE_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_service_config_reads_the_environment_under_explicit_values(clean_environment):
    """docs/configuration.md gives every service key a CUDABRIDGE_* spelling: ServiceConfig() (so
    the JVM bridge and every executor) reads it; an argument or a Spark key wins over it."""
    from cudabridge.config import ServiceConfig

    env = clean_environment
    env.setenv("CUDABRIDGE_STREAMS_PER_GPU", "3")
    env.setenv("CUDABRIDGE_POOL_LIMIT", "64m")
    assert ServiceConfig().streams_per_gpu == 3
    assert ServiceConfig().pool_limit == (64 << 20, 1.0)
    assert ServiceConfig(streams_per_gpu=5).streams_per_gpu == 5                       # an argument wins
    cfg = ServiceConfig.from_mapping({"spark.cudabridge.streamsPerGpu": "7"})
    assert (cfg.streams_per_gpu, cfg.pool_limit) == (7, (64 << 20, 1.0))              # a Spark key wins
    assert ServiceConfig.from_env({}).streams_per_gpu == 32                           # that mapping alone
    env.setenv("CUDABRIDGE_STREAMS_PER_GPU", " ")
    assert ServiceConfig().streams_per_gpu == 32                                      # set to nothing: unset
    env.setenv("CUDABRIDGE_STREAMS_PER_GPU", "0")
    with pytest.raises(InvalidArgument, match=r"CUDABRIDGE_STREAMS_PER_GPU='0': expected an integer in \[1, 1024\]"):
        ServiceConfig()


@pytest.mark.parametrize("name, message", [
    ("CUDABRIDGE_STREAMS_PER_GPUS", "unknown environment variable CUDABRIDGE_STREAMS_PER_GPUS; "
                                    "did you mean CUDABRIDGE_STREAMS_PER_GPU?"),
    ("CUDABRIDGE_POOLLIMIT", "unknown environment variable CUDABRIDGE_POOLLIMIT; did you mean CUDABRIDGE_POOL_LIMIT?"),
    ("CUDABRIDGE_TASK_BIND", "CUDABRIDGE_TASK_BIND is not read from the environment: spark.cudabridge.taskBind is a "
                             "plugin key, set in the Spark configuration (--conf spark.cudabridge.taskBind=...)"),
    ("CUDABRIDGE_SOMETHING_ELSE_ENTIRELY", "unknown environment variable CUDABRIDGE_SOMETHING_ELSE_ENTIRELY; "
                                           "no variable is close"),
])
def test_an_unknown_variable_is_refused_with_the_nearest(clean_environment, name, message):
    """A misspelled CUDABRIDGE_* variable was silently ignored; it is refused as a misspelled key
    is, with the nearest variable that is read."""
    from cudabridge.config import ServiceConfig

    clean_environment.setenv(name, "3")
    for build in (ServiceConfig, lambda: ServiceConfig.from_mapping({}), lambda: ServiceConfig(streams_per_gpu=2)):
        with pytest.raises(InvalidArgument, match=re.escape(message)):
            build()
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        ServiceConfig.from_env({name: "3"})


def test_the_scripts_variables_are_known_and_not_checked(clean_environment):
    """The variables dev/ and tests/ read (scope dev) are known names: the service starts with
    them set, whatever their values (only the scripts read them)."""
    from cudabridge.config import ServiceConfig

    for s in SETTINGS:
        if s.scope == "dev":
            clean_environment.setenv(s.env_name, "anything")
    clean_environment.setenv("CUDABRIDGE_PYTHON", "/some/python")   # the plugin key read from the environment
    assert ServiceConfig().streams_per_gpu == 32


def test_a_service_started_bare_takes_its_settings_from_the_environment(clean_environment):
    """`CudaBridgeService()`, as the demo and a Python user start it, with the settings in the
    environment only."""
    from cudabridge.service import CudaBridgeService

    for name, value in {"CUDABRIDGE_BACKEND": "emulated", "CUDABRIDGE_EMULATED_MEMORY": "64m",
                        "CUDABRIDGE_STREAMS_PER_GPU": "3", "CUDABRIDGE_HIGH_PRIORITY_STREAMS": "1",
                        "CUDABRIDGE_EMULATED_RACE_CHECK": "1"}.items():
        clean_environment.setenv(name, value)
    with CudaBridgeService() as service:
        assert service.backend.name == "emulated"
        assert service.statistics().totals()["streams"] == 4


# Names that appear in the tests only as examples of misspelled variables (refused)
NOT_VARIABLES = {"CUDABRIDGE_STREAMS_PER_GPUS", "CUDABRIDGE_POOL_LIMT"}


def test_every_cudabridge_variable_the_project_reads_is_in_the_table():
    """Unknown CUDABRIDGE_* names are refused at start, so every one that dev/, the tests, the
    library or the docs use must be a variable the table lists as read (scope dev for the
    scripts' own). Found by reading every tracked file: in the tests only where the environment is
    read or set, elsewhere wherever the name is written; docs/configuration.md's own examples of
    refused names and the generated tables are left out (the tables come from the table)."""
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    token = re.compile(r"CUDABRIDGE_[A-Z0-9_]*[A-Z0-9]")
    in_tests = re.compile(r"(?:environ(?:\.get)?\(?\[?|[sg]etenv\(|delenv\(|executorEnv\.|env=\{)\s*['\"]?"
                          r"(CUDABRIDGE_[A-Z0-9_]*[A-Z0-9])")
    found: dict[str, set[str]] = {}
    for f in files:
        path = ROOT / f
        if f == "docs/configuration.md" or not path.is_file() or path.suffix in (".so", ".jar", ".png", ".svg"):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        test_code = f.startswith(("tests/", "jvm/src/test/")) or f.endswith("test_settings_java.py")
        names = set(in_tests.findall(text)) if test_code else set(token.findall(text))
        for n in names - NOT_VARIABLES:
            found.setdefault(n, set()).add(f)
    # outside the tests a derived spelling of a plugin key may be named too (as an example, or in
    # a refusal's words); in the tests only variables that are read are set or read
    spellings = {s.env_name for s in SETTINGS if s.env_name}
    unknown = {n: sorted(fs) for n, fs in found.items()
               if n not in config.VARIABLES and not (n in spellings and not any(f.startswith("tests/") for f in fs))}
    assert unknown == {}, f"CUDABRIDGE_* names the table does not list as read (add them, scope dev for a script's): {unknown}"
    assert {"CUDABRIDGE_SKIP_JVM_TESTS", "CUDABRIDGE_EMULATED_RACE_CHECK", "CUDABRIDGE_MODEL_EXAMPLES"} <= set(found)


# --- typed values once (issue 25, item 3) ----------------------------------------------------------------
@pytest.mark.parametrize("key, given, parsed", [
    ("streamsPerGpu", " 8 ", 8), ("asyncRelease", "TRUE", True), ("poolInitial", "64m", 64 << 20),
    ("poolInitial", 4096, 4096), ("hostWaitTimeout", "0.5", 0.5), ("hostWaitTimeout", "300", 300.0),
    ("hostWaitTimeout", 2, 2.0), ("poolLimit", "0.9", (None, 0.9)), ("poolLimit", "8g", (8 << 30, 1.0)),
    ("gpuAddresses", "0, 1", ("0", "1")), ("gpuAddresses", "", ()), ("gpuAddresses", ["2"], ("2",)),
    ("logLevel", "debug", "DEBUG"), ("backend", "cuda", "cuda"), ("gpuAddressMap", "0:1", "0:1"),
])
def test_check_value_returns_the_value_parsed_once(key, given, parsed):
    """bytes as an int, seconds as a float, a limit as Limit, a list as a tuple, an enum as the
    table's spelling: callers use it as it is; a parsed value passes the check again unchanged."""
    value = check_value(key, given)
    assert value == parsed and (type(value) is type(parsed) or isinstance(value, config.Limit)), value
    assert check_value(key, value) == value


def test_service_config_fields_are_typed():
    from cudabridge.config import Limit, ServiceConfig

    cfg = ServiceConfig(pool_limit="8g", pool_initial="64m", host_wait_timeout="0.5", gpu_addresses="0,1",
                        staging_wait=2)
    assert cfg.pool_limit == Limit(8 << 30, 1.0) and cfg.pool_initial == 64 << 20
    assert (cfg.host_wait_timeout, cfg.staging_wait, cfg.gpu_addresses) == (0.5, 2.0, ("0", "1"))
    assert (cfg.pinned_pool, cfg.staging_slot_bytes, cfg.emulated_memory) == (64 << 20, 4 << 20, 16 << 30)
    import dataclasses

    assert dataclasses.replace(cfg, backend="emulated").pool_limit == cfg.pool_limit   # re-checked as parsed
    for bad in ({"host_wait_timeout": True}, {"host_wait_timeout": float("inf")}, {"pool_limit": Limit(None, 2.0)},
                {"pool_limit": Limit(255, 1.0)}, {"gpu_addresses": [1]}):
        with pytest.raises(InvalidArgument):
            ServiceConfig(**bad)


# --- the table is checked where it is read (the service's import, the jar's build) ---------------------
def test_env_names_split_at_capitals_and_dots_not_inside_acronyms():
    def env(key: str) -> str:
        return config.Setting(key=key, scope="service", type="string", default=None, doc="").env_name

    assert env("streamsPerGpu") == "CUDABRIDGE_STREAMS_PER_GPU" and env("a.b") == "CUDABRIDGE_A_B"
    assert env("gpuAddressMap") == "CUDABRIDGE_GPU_ADDRESS_MAP" and env("cudaURL") == "CUDABRIDGE_CUDA_URL"
    assert env("level2Cache") == "CUDABRIDGE_LEVEL2_CACHE"


def _table(tmp_path: Path, change=None, text: str | None = None) -> Path:
    import json

    t = json.loads(config.TABLE.read_text())
    if change:
        change(t)
    path = tmp_path / "settings.json"
    path.write_text(text if text is not None else json.dumps(t))
    return path


def _entry(t: dict, key: str) -> dict:
    return next(e for e in t["settings"] if e["key"] == key)


@pytest.mark.parametrize("change, text, message", [
    (None, '{"a": 1,}', "Expecting property name enclosed in double quotes: line 1 column 9"),
    (None, '{"prefix": "spark.cudabridge.", "prefix": "x", "settings": []}', "key 'prefix' appears twice in one object"),
    (None, '{"prefix": "spark.cudabridge.", "settings": [NaN]}', "NaN is not JSON"),
    (lambda t: t.update(extra=1), None, "unknown field 'extra' at the top"),
    (lambda t: t["settings"][0].update(defualt="auto"), None, "settings[0] (backend): unknown field 'defualt'"),
    (lambda t: _entry(t, "poolLimit").update(default="255"), None,
     "poolLimit: its default is refused by its own type: spark.cudabridge.poolLimit='255': 255 bytes is below"),
    (lambda t: _entry(t, "taskBind").update(values=[]), None, "(taskBind): an enum needs its 'values'"),
    (lambda t: _entry(t, "taskBind").update(values=["lazy", "lazy"]), None, "must be distinct non-empty strings"),
    (lambda t: _entry(t, "backend").update(scope="executor"), None, "scope executor is none of"),
    (lambda t: _entry(t, "backend").update(type="float"), None, "type float is none of"),
    (lambda t: t["settings"].append(dict(t["settings"][0])), None, "key backend twice"),
    (lambda t: _entry(t, "streamsPerGpu").update(min=2000), None, "min 2000 is above max 1024"),
    (lambda t: _entry(t, "streamsPerGpu").update(max="9"), None, "'max' must be an integer, got '9'"),
    (lambda t: _entry(t, "backend").update(min=1), None, "(backend): 'min' is for types int and bytes only"),
    (lambda t: _entry(t, "library").update(defaultDoc=None), None, "a null default needs a 'defaultDoc'"),
    (lambda t: _entry(t, "backend").update(env=True), None, "'env' is true or false, for scope plugin only"),
    (lambda t: _entry(t, "backend").pop("default"), None, "'default' is missing"),
    (lambda t: _entry(t, "backend").update(key="back end"), None, "'key' must be a string of letters and digits"),
    (lambda t: t["settings"].append({**_entry(t, "poolLimit"), "key": "pool.limit"}), None,
     "pool.limit: its spelling CUDABRIDGE_POOL_LIMIT is poolLimit's too"),
])
def test_a_malformed_table_is_refused_naming_the_entry(tmp_path, change, text, message):
    with pytest.raises(config.TableError, match=re.escape(message)):
        config.load_table(_table(tmp_path, change, text))


def test_the_table_is_read_as_it_is():
    assert config.load_table() == SETTINGS


# --- the Java side generated from it (cudabridge/jvm/settings_java.py; tests/test_settings_java.py runs it) ---
def test_the_java_source_is_generated_deterministically_from_the_table():
    from cudabridge.jvm import settings_java

    source = settings_java.generate(SETTINGS)
    assert source == settings_java.generate(config.load_table()) and source.isascii()
    for s in SETTINGS:
        assert f"public static final Setting {settings_java.constant_name(s)} = new Setting(" in source
    names = {s.key: settings_java.constant_name(s) for s in SETTINGS}
    assert (names["poolLimit"], names["metrics.refreshMs"], names["python"]) == (
        "POOL_LIMIT", "METRICS_REFRESH_MS", "PYTHON")
    assert (names["cudabridge.python"], names["cudabridge.gate.holdMicros"]) == ("PYTHON_PROPERTY",
                                                                                 "GATE_HOLD_MICROS_PROPERTY")
    assert "ALL = List.of(\n            BACKEND,\n" in source


def test_the_generator_escapes_what_java_would_read_as_code():
    from cudabridge.jvm import settings_java as gen

    assert gen.java_string('a"b\\c\n\u00e9\U0001f600') == '"a\\"b\\\\c\\u000a\\u00e9\\ud83d\\ude00"'
    # in a comment: no end of it, no tag, no \u escape (javac reads those in comments too), ASCII
    assert gen.javadoc_text("x */ @see \\u0041 <b> & 1/2 \u00e9") == \
        "x *&#47; &#64;see &#92;u0041 &lt;b&gt; &amp; 1/2 &#233;"


def test_the_generator_refuses_two_settings_with_one_constant(tmp_path):
    from cudabridge.jvm import settings_java

    dup = config.Setting(key="pool.limit", scope="service", type="string", default=None, doc="", default_doc="x")
    with pytest.raises(settings_java.GenerateError, match="poolLimit and pool.limit get one Java constant, POOL_LIMIT"):
        settings_java.generate((*SETTINGS, dup))
    with pytest.raises(settings_java.GenerateError, match=r"the settings table is malformed: .*unknown field 'x'"):
        settings_java.write(tmp_path, _table(tmp_path, lambda t: t["settings"][0].update(x=1)))
    out = settings_java.write(tmp_path / "src")
    assert out == tmp_path / "src" / "org" / "cudabridge" / "SettingsTable.java"
    assert out.read_text() == settings_java.generate(SETTINGS)
