"""Strict test setup: 8 host CPU devices (FSDP meshes), deviceless GPU compiles, rank promotion
raises; the two ways tests run the command line (``cli`` in this process, ``console_script`` in a
new one)."""

import atexit
import fcntl
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

# A hermetic run: the suite neither reads nor writes the user's home.  One temporary directory per
# run (xdist's workers inherit it through the environment) holds HOME, the XDG cache/config/data
# directories, matplotlib's config, JAX's compilation cache and TIERAX_CALIBRATION's file (absent:
# a test that needs this machine's calibrated CPU rates asks for ``calibrated_cpu``).  Set before
# tierax, JAX or MaxText is imported (they read these at import), and inherited by every CLI
# process a test starts.  The first process of the run records the real home and the state of its
# tierax cache; ``pytest_sessionfinish`` fails the run if the suite changed that cache.
_TMP = os.environ.get("TIERAX_TESTS_TMP")
if _TMP is None:  # this process starts the run
    _TMP = tempfile.mkdtemp(prefix="tierax-tests-")
    atexit.register(shutil.rmtree, _TMP, True)
    os.environ["TIERAX_TESTS_TMP"] = _TMP
    os.environ["TIERAX_TESTS_REAL_HOME"] = os.path.expanduser("~")
_HOME = pathlib.Path(_TMP) / "home"
for _key, _value in {
    "HOME": _HOME,
    "XDG_CACHE_HOME": _HOME / ".cache",
    "XDG_CONFIG_HOME": _HOME / ".config",
    "XDG_DATA_HOME": _HOME / ".local" / "share",
    "XDG_STATE_HOME": _HOME / ".local" / "state",
    "MPLCONFIGDIR": _HOME / ".config" / "matplotlib",
    "TIERAX_CALIBRATION": pathlib.Path(_TMP) / "calibration.json",
    # JAX's compilation cache, for this run only: many tests compile the same program (a tiny
    # model's save-all step, the reference of every gradient check), and the cache is keyed on
    # the program, its compile options, the XLA flags and the backend, so a hit is the
    # executable XLA would build again.
    "JAX_COMPILATION_CACHE_DIR": pathlib.Path(_TMP) / "xla-cache",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}.items():
    os.environ[_key] = str(_value)
_HOME.mkdir(exist_ok=True)
# The real home's tierax cache, which the suite must leave as it found it.
REAL_TIERAX_CACHE = pathlib.Path(os.environ["TIERAX_TESTS_REAL_HOME"]) / ".cache" / "tierax"
# The calibration ``calibrated_cpu`` measures, once per run (shared by xdist's workers).
MEASURED_CALIBRATION = pathlib.Path(_TMP) / "measured-calibration.json"


def tree_state(root: pathlib.Path) -> dict | None:
    """Every file under ``root`` with its size and modification time; None where ``root`` is
    absent."""
    if not root.exists():
        return None
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = pathlib.Path(dirpath) / name
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            state[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return state


_REAL_CACHE_BEFORE = tree_state(REAL_TIERAX_CACHE)

from tierax.launch import flags as xla_flags  # noqa: E402

# Must run before any JAX operation: the one place tierax sets backend options.
xla_flags.configure(cpu_devices=8, deviceless_gpu=True)

import jax  # noqa: E402
import pytest  # noqa: E402

# The suite's time goes mostly to tracing (JAX's and tierax's own walks of jaxprs), which makes
# millions of short-lived objects: the cyclic collector's default young-generation threshold (700
# allocations) has it scan them over and over.  A larger one collects the same garbage less often;
# what a test computes is unchanged (nothing in tierax depends on when a cycle is freed, and the
# bench frees its plans' state with explicit gc.collect() calls).  The modules imported by the end
# of collection are frozen out of the collector's scans (pytest_collection_finish).
gc.set_threshold(100_000, 50, 100)

jax.config.update("jax_numpy_rank_promotion", "raise")
# Again through the config: a plugin may have imported JAX before this file set the environment.
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
)
jax.config.update(
    "jax_persistent_cache_min_entry_size_bytes",
    int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
)


def pytest_sessionstart(session):
    """``make test`` runs the default environment, which has MaxText: there the MaxText tests
    must run, not skip (TIERAX_REQUIRE_MAXTEXT, set by the Makefile)."""
    from tierax.interop.maxtext_program.config import maxtext_importable

    if os.environ.get("TIERAX_REQUIRE_MAXTEXT") and not maxtext_importable():
        raise pytest.UsageError(
            "TIERAX_REQUIRE_MAXTEXT is set but MaxText is not importable: the default environment "
            "installs it (make venv, Python >= 3.12, the maxtext extra)"
        )


def pytest_collection_finish(session):
    """Every module the tests import is loaded by now: its objects live as long as the process,
    so the cyclic collector need not scan them again (see gc.set_threshold above)."""
    gc.freeze()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if it created, changed or removed anything in the real home's tierax cache
    (checked once, by the process that started the run: xdist's workers share its home)."""
    if hasattr(session.config, "workerinput"):
        return
    after = tree_state(REAL_TIERAX_CACHE)
    if after == _REAL_CACHE_BEFORE:
        return
    before, after = _REAL_CACHE_BEFORE or {}, after or {}
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    print(
        f"\nthe test run changed {REAL_TIERAX_CACHE} (the user's real tierax cache): "
        + (", ".join(changed[:10]) or "the directory itself")
        + "; a test wrote the home directory instead of the run's temporary one "
        + f"({_TMP}): give it tmp_path or the calibrated_cpu fixture",
        file=sys.stderr,
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def measured_cpu_calibration() -> pathlib.Path:
    """A calibration file holding this machine's CPU rates, measured once per run by tierax's own
    ``calibrate`` code (``measure``, then ``save`` under the ``cpu`` key; one repeat each: a test
    needs measured rates, not precise ones).  xdist's workers share it: the first to get the lock
    measures, the others read."""
    with open(MEASURED_CALIBRATION.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not MEASURED_CALIBRATION.exists():
            from tierax.measure import calibrate

            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("TIERAX_CALIBRATION", str(MEASURED_CALIBRATION))
                calibrate.save(calibrate.measure(repeats=1), key="cpu")
    assert "cpu" in json.loads(MEASURED_CALIBRATION.read_text())
    return MEASURED_CALIBRATION


@pytest.fixture
def calibrated_cpu(measured_cpu_calibration, monkeypatch) -> pathlib.Path:
    """This test reads (and its CLI processes inherit) the run's measured CPU calibration
    (``measured_cpu_calibration``) through TIERAX_CALIBRATION; without it target 'cpu' has no
    rates."""
    monkeypatch.setenv("TIERAX_CALIBRATION", str(measured_cpu_calibration))
    return measured_cpu_calibration


@pytest.fixture(scope="session")
def tiny_names():
    return ["tiny-llama", "tiny-deepseek"]


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run a tierax command in this process: ``cli("plan", "--model", ...)`` returns its exit code
    and what it printed (``returncode``, ``stdout``, ``stderr``, as ``console_script``'s).

    JAX's backend is already started here (8 CPU devices), so a verb's XLA flag setup has nothing
    left to set; a test that needs other devices or flags at start-up uses ``console_script``."""
    from tierax.cli import main

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")

    def run(*args) -> subprocess.CompletedProcess:
        capsys.readouterr()  # what the test printed before is not the command's
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse: --help, a usage error
            code = e.code if isinstance(e.code, int) else 2
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["tierax", *map(str, args)], code, out, err)

    return run


@pytest.fixture(scope="session")
def console_script():
    """Run the installed ``tierax`` console script (else ``python -m tierax.cli``) in a new process,
    stdin closed: for what only a process shows (the entry point, XLA flags and devices read at
    start-up, a signal, a closed pipe, an exit after a failed write).  Each start of JAX costs
    seconds: everything else uses ``cli``."""
    exe = shutil.which("tierax")
    prefix = [exe] if exe else [sys.executable, "-m", "tierax.cli"]

    def run(*args, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*prefix, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            **kwargs,
        )

    return run


# MaxText's programs traced in this process, by file, keys and sizes (maxtext_programs_once).
_MAXTEXT_PROGRAMS: dict = {}


@pytest.fixture(scope="module")
def maxtext_programs_once():
    """MaxText's program of the same file, keys and sizes (tierax.interop.maxtext_program's
    ``program``, whether a test calls it or a verb it runs in this process does) built once per
    test process and shared: the same arguments trace the same program, and a MaxText trace takes
    seconds.  A call refused (an exception) is not kept; a program built with other arguments is
    built anew.  Module-scoped, so that it is in place before the module's own module-scoped
    fixtures build their programs (a function-scoped one came after them: their programs were
    neither taken from nor kept in the shared ones)."""
    from tierax.interop.maxtext_program import as_program

    build = as_program.program

    def program(path, overrides=(), **kwargs):
        key = (str(path), tuple(overrides), repr(sorted(kwargs.items())))
        if key not in _MAXTEXT_PROGRAMS:
            _MAXTEXT_PROGRAMS[key] = build(path, overrides, **kwargs)
        return _MAXTEXT_PROGRAMS[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(as_program, "program", program)
        yield


@pytest.fixture
def v5e_mesh(monkeypatch):
    """A one-device mesh of a deviceless v5e topology, built in this test process.  libtpu holds a
    multi-process lockfile unless told otherwise, and the suite's other workers may be compiling for
    a TPU at the same moment: the environment tierax's own deviceless start sets
    (tierax.launch.start_deviceless_tpu) lets them share it."""
    from jax.sharding import Mesh

    from tierax import hardware
    from tierax.xla import compile as xla_compile

    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    topology = xla_compile.tpu_topology(hardware.get_target("v5e"), 1)
    return Mesh(topology.devices[:1], ("x",))
