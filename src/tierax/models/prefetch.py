"""A layer scan whose backward prefetches offloaded residuals one layer ahead.

Under a ``jax.checkpoint`` offload policy XLA loads layer i's offloaded residuals in
the backward iteration that uses them and waits for them before the layer's
attention: nothing overlaps the load (DESIGN.md, "Facts").  This scan has a custom
VJP that moves the copies itself:

* **forward**: each layer runs once; the tagged values the plan keeps are recorded
  (:class:`tierax.models.tags.Tape`), those it offloads are put in host memory
  (``jax.device_put(v, Space.Host)``) as they are produced, and the scan stacks them,
  with every layer's input, as the residuals.
* **backward** (reverse scan): the carry holds layer i's offloaded residuals, already
  on device.  Iteration i first issues the host → device copy of layer i−1's, then
  computes layer i's VJP with the saved values injected (:func:`tags.tag` replaces
  them, so their producers are not recomputed; untagged intermediates are), and
  hands the fetched copy to iteration i−1.  The copy has a whole layer's backward to
  finish: double buffering costs one extra layer of offloaded residuals on device.

Names a plan rematerialises are recomputed inside the backward iteration, as under
``save_only_these_names``; the gradient is the layer's exact gradient (tested against
the no-remat step for every model and preset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from tierax.models.tags import Tape

LayerBody = Callable[[jax.Array, object], jax.Array]  # (x, one layer's state) -> y


def _fetch(host: dict, i) -> dict:
    """Layer ``i``'s slices of the host stacks, copied to device."""
    return {n: jax.device_put(jax.lax.dynamic_index_in_dim(h, i, keepdims=False), jax.memory.Space.Device)
            for n, h in host.items()}


def prefetch_scan(body: LayerBody, keep: Iterable[str], offload: Iterable[str]) -> Callable:
    """``run(x0, stacked_state) -> y``: ``body`` scanned over the layers, differentiable.

    Args:
      body: one layer, ``body(x, layer_state) -> y``; it tags activations with :func:`tags.tag`.
      keep: names saved in device memory between the passes.
      offload: names saved in host memory and prefetched one layer ahead in the backward.
    """
    keep, offload = frozenset(keep), frozenset(offload)
    if not offload:
        raise ValueError("prefetch_scan needs at least one offloaded name; use a checkpoint policy otherwise")

    def collect(x, p):
        tape = Tape(collect=keep | offload)
        with tape.active():
            y = body(x, p)
        tape.check_complete()
        return y, tape.values

    def inject(x, p, saved):
        tape = Tape(inject=saved)
        with tape.active():
            y = body(x, p)
        tape.check_complete()
        return y

    @jax.custom_vjp
    def run(x0, state):
        y, _ = jax.lax.scan(lambda x, p: (body(x, p), None), x0, state)
        return y

    def run_fwd(x0, state):
        def step(x, p):
            y, values = collect(x, p)
            dev = {n: values[n] for n in keep}
            host = {n: jax.device_put(values[n], jax.memory.Space.Host) for n in offload}
            return y, (x, dev, host)

        y, (xs, dev, host) = jax.lax.scan(step, x0, state)
        return y, (xs, dev, host, state)

    def run_bwd(res, ct_y):
        xs, dev, host, state = res
        n_layers = xs.shape[0]

        def step(carry, inp):
            ct, current = carry
            i, x, d, p = inp
            # Issued before this layer's backward, consumed by the next iteration (layer i−1).
            # At i = 0 it re-reads layer 0: one spare copy per step, no branch in the loop.
            upcoming = _fetch(host, jnp.maximum(i - 1, 0))
            _, vjp = jax.vjp(lambda x, p: inject(x, p, {**d, **current}), x, p)
            ct_x, ct_p = vjp(ct)
            return (ct_x, upcoming), ct_p

        first = _fetch(host, n_layers - 1)
        idx = jnp.arange(n_layers, dtype=jnp.int32)
        (ct_x0, _), ct_state = jax.lax.scan(step, (ct_y, first), (idx, xs, dev, state), reverse=True)
        return ct_x0, ct_state

    run.defvjp(run_fwd, run_bwd)
    return run


@dataclass(frozen=True)
class Prefetch:
    """What a layer group runs under a prefetching plan (built by :func:`tierax.plan.to_policies`)."""

    keep: frozenset[str]
    offload: frozenset[str]
