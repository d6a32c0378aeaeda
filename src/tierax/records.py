"""Result records: schema names, the envelope every record carries, reading them back.

JAX-free at import time (``tierax report`` reads records without starting JAX).
Every JSON record tierax or its bench scripts write starts with the same
envelope: ``schema``, ``command``, ``created``, ``machine``, ``jax_version``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shlex
import sys
import time
from collections.abc import Sequence

from tierax.errors import TieraxError
from tierax.fileio import check_replaceable_file, write_text_atomic

BENCH_SCHEMA = "tierax.bench/1"
PROFILE_SCHEMA = "tierax.profile/1"
GPU_CHECK_SCHEMA = "tierax.gpu-check/1"
VERIFY_SCHEMA = "tierax.verify/1"
SWEEP_SCHEMA = "tierax.sweep/1"
WHATIF_SCHEMA = "tierax.whatif/1"
MESH_SEARCH_SCHEMA = "tierax.mesh-search/1"


# The arguments of the command line being run: ``tierax.cli.main(argv)`` sets them for the call, so
# a record made by a verb called in-process (``main([...])``) names that verb, not the process's
# own ``sys.argv``.
_INVOKED: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "tierax_invoked_argv", default=None
)


@contextlib.contextmanager
def invoked_with(argv: Sequence[str]):
    """Within the block, :func:`command_line` defaults to ``argv`` (the verb's own arguments)."""
    token = _INVOKED.set(tuple(argv))
    try:
        yield
    finally:
        _INVOKED.reset(token)


def command_line(argv: Sequence[str] | None = None, prog: str = "tierax") -> str:
    """The command as a user would retype it: ``prog`` plus ``argv``; by default the arguments
    ``tierax.cli.main`` was called with, else ``sys.argv[1:]``."""
    if argv is None:
        argv = _INVOKED.get()
    args = sys.argv[1:] if argv is None else argv
    return " ".join([prog, *(shlex.quote(a) for a in args)])


# The CPU features XLA:CPU's GEMM kernels depend on (bfloat16 and wide-vector paths): a record
# made on another CPU model of the same virtual machine kind says so.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_model(cpuinfo: str) -> dict:
    """The CPU model name and which of :data:`CPU_FEATURES` it has, from ``/proc/cpuinfo``'s
    text (its first processor's ``model name`` and ``flags`` lines); empty where they are absent."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "flags", "Features"):
            fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    out: dict = {}
    if "model name" in fields:
        out["cpu_model"] = fields["model name"]
    if flags:
        out["cpu_features"] = [f for f in CPU_FEATURES if f in flags]
    return out


def host_info() -> dict:
    """Host, CPU (its model and GEMM-relevant features where ``/proc/cpuinfo`` tells) and Python
    version (JAX-free)."""
    try:
        cpu = cpu_model(pathlib.Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu = {}
    return {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        **cpu,
        "python": sys.version.split()[0],
    }


def jax_version() -> str | None:
    """The jax this process runs (read from its installed metadata if not imported yet; JAX-free);
    None when jax is not installed."""
    if "jax" in sys.modules:
        return sys.modules["jax"].__version__
    try:
        return importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    """Platform, device kind and count, host, CPU and versions (starts JAX's backend)."""
    import jax

    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        **host_info(),
        "jax": jax.__version__,
    }


def envelope(schema: str, command: str, *, devices: bool = True) -> dict:
    """The fields every record starts with; ``devices=False`` leaves the devices out of
    ``machine`` and does not start (or import) JAX."""
    return {
        "schema": schema,
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info() if devices else host_info(),
        "jax_version": jax_version(),
    }


def write_record(path: str | os.PathLike, doc: dict) -> pathlib.Path:
    """Write ``doc`` as indented JSON, atomically."""
    return write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


def is_record(path: pathlib.Path, schema: str) -> bool:
    """Whether ``path`` holds a JSON record of ``schema``."""
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("schema") == schema
    except (OSError, ValueError, AttributeError):
        return False


def check_replaceable(
    path: pathlib.Path, schema: str, why: str, *, force: bool = False
) -> pathlib.Path:
    """Refuse to replace ``path`` unless it is absent or a record of ``schema`` (what an earlier run
    of the same command wrote there), or ``force``: an output the user did not name is not theirs
    to lose (the one rule, :func:`tierax.fileio.check_replaceable_file`).

    Raises:
      TieraxError: ``path`` exists and is anything else (``why`` says how it came to be the target).
    """
    return check_replaceable_file(
        path, why, ours=lambda p: is_record(p, schema), what=f"a {schema} record", force=force
    )


def load_record(path: str | os.PathLike, schemas: Sequence[str], *, hint: str) -> dict:
    """Read a JSON record and check its schema.

    Args:
      schemas: the schemas the caller reads.
      hint: how to make a readable record (appended to every message).

    Raises:
      TieraxError: missing file, not UTF-8 JSON, not an object, or another schema.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise TieraxError(f"results file {str(p)!r} does not exist; {hint}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TieraxError(f"results file {str(p)!r} is not JSON ({e}); {hint}") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema not in schemas:
        raise TieraxError(
            f"results file {str(p)!r} has schema {schema!r}; this tierax reads "
            f"{' and '.join(schemas)}. {hint}"
        )
    return doc


def finite(x) -> bool:
    """A real, finite number (bools excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
