"""The installed libtpu: its version, and where XLA:TPU's memory figures depend on it.

The TPU cost-model terms were traced on libtpu 0.0.52 (bench/results/tpu_compile.json), the release
``make venv`` installs (the ``tpu-aot`` extra on Python >= 3.12, what MaxText 0.2.5's own install
resolves to): its ``temp_size_in_bytes`` is its own buffer assignment's preallocated temp.  Older
releases differ in what ``memory_analysis()`` reports, not in the step's buffers: jax 0.10.2's
libtpu 0.0.42.1 holds the same buffers as 0.0.52's and a preallocated temp of the same size (at 2, 4
and 32 layers of Llama 3 8B), while its ``temp_size_in_bytes`` exceeds that allocation
(bench/results/libtpu_trace_0.0.42.1.json beside libtpu_trace_0.0.52.json); jax 0.12's own pin,
0.0.50.1, exceeds it too, by amounts no rule here follows (MaxText's compiles of
bench/maxtext_fidelity.py's cases).  Versions before 0.0.52 are read as 0.0.42.1.
"""

from __future__ import annotations

import importlib.metadata
import re

TRACED = (0, 0, 52)  # the libtpu the TPU terms were traced on
OLDER_SOURCE = (
    "libtpu {version}: its temp_size_in_bytes exceeds its buffer assignment at an untiled loss "
    "(tierax.costmodel.fixed.libtpu_temp_excess_bytes, bench/results/tpu_default_env.json)"
)


def installed_version() -> str:
    """The installed libtpu's version ("" where it is not installed)."""
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return ""


def version_tuple(version: str | None = None) -> tuple[int, ...]:
    """``version`` (default: the installed one) as numbers, e.g. "0.0.42.1" → (0, 0, 42, 1); ()
    where none is installed."""
    text = installed_version() if version is None else version
    return tuple(int(p) for p in re.findall(r"\d+", text))


def older_than_traced(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed libtpu) predates :data:`TRACED`: its memory
    figures follow 0.0.42.1's.  False where no libtpu is installed (the traced terms apply)."""
    parts = version_tuple(version)
    return bool(parts) and parts[:3] < TRACED
