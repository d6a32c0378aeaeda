"""MaxText's own program as tierax's input: its config loaded by MaxText's loader, its decoder's
scanned layer stacks traced from MaxText's code (nothing of its models re-described).

* :mod:`.config` — a MaxText config or model file loaded as MaxText loads it, tierax's sizing
  flags mapped onto MaxText's keys, what tierax cannot price refused.
* :mod:`.trace` — the activation inventory of MaxText's layer stacks and its train state.
* :mod:`.as_program` — the Program the cost model prices and MaxText's remat policy as a Plan
  (:func:`program`).
* :mod:`.emit` — a plan of MaxText's program written as MaxText keys.

MaxText is imported only when these are called (tierax runs without it).
"""

from __future__ import annotations

import contextlib
import sys

from tierax.interop.maxtext_program.config import Loaded, load, require_maxtext


def inventory(
    path: str,
    overrides=(),
    *,
    mesh=None,
    microbatch: int | None = None,
    seq: int | None = None,
    grad_accum: int | None = None,
):
    """The per-device :class:`~tierax.tracing.inventory.Inventory` of MaxText's program for the
    config or model file ``path`` with ``overrides`` (``key=value``) and tierax's flags (None: the
    config's value).  What MaxText prints on stdout (its notes) goes to stderr, so that stdout holds
    only tierax's output (``--json``)."""
    with contextlib.redirect_stdout(sys.stderr):
        from tierax.interop.maxtext_program.trace import program_inventory

        with load(
            path, overrides, mesh=mesh, microbatch=microbatch, seq=seq, grad_accum=grad_accum
        ) as loaded:
            return program_inventory(loaded)


def program(path: str, overrides=(), **kwargs):
    """MaxText's program of ``path`` as tierax prices it
    (:func:`tierax.interop.maxtext_program.as_program.program`)."""
    from tierax.interop.maxtext_program.as_program import program as build

    return build(path, overrides, **kwargs)


__all__ = ["Loaded", "inventory", "load", "program", "require_maxtext"]
