"""Strict test setup: 8 host CPU devices (FSDP meshes), deviceless GPU compiles, rank promotion
raises; the two ways tests run the command line (``cli`` in this process, ``console_script`` in a
new one)."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

# JAX's compilation cache, for this run only (a new directory, removed at exit): many tests compile
# the same program (a tiny model's save-all step, the reference of every gradient check), and the
# cache is keyed on the program, its compile options, the XLA flags and the backend, so a hit is the
# executable XLA would build again.  Set before JAX is imported (it reads these at import), and
# inherited by the CLI processes ``console_script`` starts.
_XLA_CACHE = tempfile.mkdtemp(prefix="tierax-tests-xla-cache-")
atexit.register(shutil.rmtree, _XLA_CACHE, True)
for _key, _value in {
    "JAX_COMPILATION_CACHE_DIR": _XLA_CACHE,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}.items():
    os.environ.setdefault(_key, _value)

from tierax.launch import flags as xla_flags  # noqa: E402

# Must run before any JAX operation: the one place tierax sets backend options.
xla_flags.configure(cpu_devices=8, deviceless_gpu=True)

import jax  # noqa: E402
import pytest  # noqa: E402

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
