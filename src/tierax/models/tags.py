"""Tagging activations: ``checkpoint_name`` plus a tape that can read or replace them.

Every activation a plan can place goes through :func:`tag`.  Outside a tape it is
exactly ``jax.ad_checkpoint.checkpoint_name`` (what ``jax.checkpoint`` policies see).
Inside a :class:`Tape` (set up by :mod:`tierax.models.prefetch` while tracing one
layer) it also

* **records** the values of the names the tape collects (the forward pass keeps them
  as the layer's residuals), or
* **injects** saved values in place of recomputing them: the tagged value is replaced
  by the saved one, and the cotangent flows back to the op that produced it, so the
  gradient is the layer's gradient at the saved point while that op's forward is dead
  code for XLA to drop.

A tape is per trace (a context variable), so nested or concurrent traces don't mix.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from tierax.errors import TieraxError

_TAPE: contextvars.ContextVar[Tape | None] = contextvars.ContextVar("tierax_tape", default=None)


@jax.custom_vjp
def _inject(computed, saved):
    del computed
    return saved


def _inject_fwd(computed, saved):
    del computed
    return saved, None


def _inject_bwd(_, ct):
    # The cotangent goes to the op that produced the value; the saved copy is a constant.
    return ct, jnp.zeros_like(ct)


_inject.defvjp(_inject_fwd, _inject_bwd)


class Tape:
    """Records (``collect``) or replaces (``inject``) tagged values during one layer trace."""

    def __init__(
        self, *, collect: Iterable[str] = (), inject: Mapping[str, jax.Array] | None = None
    ):
        self.collect = frozenset(collect)
        self.inject = dict(inject or {})
        self.values: dict[str, jax.Array] = {}
        self.seen: set[str] = set()

    def see(self, name: str, x):
        if name in self.seen and (name in self.collect or name in self.inject):
            raise TieraxError(
                f"activation {name!r} is tagged twice in one layer; a prefetching plan needs each "
                "placed name once per layer"
            )
        self.seen.add(name)
        if name in self.inject:
            saved = self.inject[name]
            if saved.shape != x.shape or saved.dtype != x.dtype:
                raise TieraxError(
                    f"saved {name!r} is {saved.dtype}{list(saved.shape)} but the layer computes "
                    f"{x.dtype}{list(x.shape)}"
                )
            return _inject(x, saved)
        if name in self.collect:
            self.values[name] = x
        return x

    def check_complete(self) -> None:
        """Every name the tape was asked for was tagged by the layer."""
        missing = sorted((self.collect | set(self.inject)) - self.seen)
        if missing:
            raise TieraxError(
                f"the layer never tags {', '.join(map(repr, missing))}; a plan may place only the "
                "names its layer tags"
            )

    @contextlib.contextmanager
    def active(self):
        token = _TAPE.set(self)
        try:
            yield self
        finally:
            _TAPE.reset(token)


def tag(x, name: str):
    """``checkpoint_name(x, name)``, seen by the active :class:`Tape` if there is one."""
    x = checkpoint_name(x, name)
    tape = _TAPE.get()
    return x if tape is None else tape.see(name, x)
