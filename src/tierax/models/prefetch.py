"""A layer scan whose backward prefetches offloaded residuals one layer ahead.

Under a ``jax.checkpoint`` offload policy XLA loads layer i's offloaded residuals in
the backward iteration that uses them and waits for them before the layer's
attention: nothing overlaps the load (XLA:GPU's schedule in a deviceless compile, jaxlib
0.10.2; tests/test_compile.py asserts it).  This scan has a custom
VJP that moves the copies itself:

* **forward**: each layer runs once; the tagged values the plan keeps are recorded
  (:class:`tierax.models.tags.Tape`); those it offloads are put in host memory
  (``jax.device_put(v, Space.Host)``) and written into per-name host stacks carried by the scan,
  each under a ``tierax_offload_<name>`` scope that XLA keeps in the store's op_name (``compile``
  finds each name's host buffer by it).  XLA ends a copy in the loop iteration that starts it, so
  a store issued in its own layer hides only under what follows the value there: values made
  before the attention (:data:`tierax.names.BEFORE_ATTENTION`) are stored in their own layer as
  they are made; any other (little follows the MLP's up-projection) is carried one layer on
  device and stored while the next layer computes (XLA:TPU starts such a store only as early as
  its latency estimate asks, later than an early value's own: bench/results/tpu_copy_schedule.json).
  Their last layer stays on device (the backward starts with it): their host stacks hold all
  layers but the last (:func:`host_slots`).  The stacks, those last values and every layer's
  input are the residuals.
* **backward** (reverse scan): the carry holds layer i's offloaded residuals, already
  on device (the last layer's from the forward).  Iteration i first issues the host → device
  copy of layer i−1's, then computes layer i's VJP with the saved values injected
  (:func:`tags.tag` replaces them, so their producers are not recomputed; untagged
  intermediates are), and hands the fetched copy to iteration i−1.  The copy has a whole
  layer's backward to finish: double buffering costs one extra layer of offloaded residuals on
  device.

Names a plan rematerialises are recomputed inside the backward iteration, as under
``save_only_these_names``; the gradient is the layer's exact gradient (tested against
the no-remat step for every model and preset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax._src.lax.lax import (
    empty2 as _empty,
)  # what jax.lax.scan stacks its outputs into; no public equivalent
from jax.experimental.layout import Layout, with_layout_constraint

from tierax import names as N
from tierax.models.tags import Tape

LayerBody = Callable[[jax.Array, object], jax.Array]  # (x, one layer's state) -> y


# Each offloaded name's store to host (and load back) runs under this scope + the name.  XLA keeps
# the scope in the op_name metadata of the dynamic-update-slice that writes the host buffer, so the
# compile report finds each name's host buffer by name (equal-size names, e.g. key/value
# projections, are otherwise indistinguishable).
OFFLOAD_SCOPE_PREFIX = "tierax_offload_"


def _fetch(host: dict, i) -> dict:
    """Layer ``i``'s slices of the host stacks, copied to device."""
    out = {}
    for n, h in host.items():
        with jax.named_scope(OFFLOAD_SCOPE_PREFIX + n):
            out[n] = jax.device_put(
                jax.lax.dynamic_index_in_dim(h, i, keepdims=False), jax.memory.Space.Device
            )
    return out


def _host_stacks(values: dict, layers: int) -> dict:
    """Zero stacks of ``layers`` slices for the offloaded values (shape/dtype structs).  Like a
    scan's stacked
    outputs, a broadcast that XLA's host offloader turns into a host allocation once a host store
    writes it."""
    # jax.lax.scan builds its stacked outputs the same way
    # (jax._src.lax.control_flow.loops._empty_array); no public API makes a host-space broadcast
    # without device compute in host memory (a host scalar broadcast is "converted into host
    # compute" by XLA's host offloader, a device zeros array is a device-sized copy).
    return {
        n: jax.lax.broadcast(
            _empty(v.dtype, memory_space=jax.memory.Space.Host), (layers, *v.shape)
        )
        for n, v in values.items()
    }


def _store(stacks: dict, values: dict, j) -> dict:
    """Write layer ``j``'s offloaded ``values``, put in host memory, into their stacks, each under
    its name's scope (the other stacks pass unchanged)."""
    out = dict(stacks)
    for n, s in stacks.items():
        if n not in values:
            continue
        with jax.named_scope(OFFLOAD_SCOPE_PREFIX + n):
            out[n] = jax.lax.dynamic_update_index_in_dim(
                s, jax.device_put(values[n], jax.memory.Space.Host), j, 0
            )
    return out


def _row_major(values: dict) -> dict:
    """The kept values as the backward reads them: row-major, on a TPU lowering only.

    On XLA:TPU a kept projection output can come out of a windowed-einsum all-gather in a
    tokens-minor layout, while this scan's backward (and XLA's peeled last iteration of it) reads
    the stacked residual row-major; XLA then copies each such whole stack at the step's peak (two
    stacks of Llama 3 8B's up-projections on 8 v6e at 1 × 4096:
    bench/results/tpu_default_env_v6e.json, tests/test_tpu_kept_layout.py).  Fixing the layout
    where the value is produced moves the transpose into the producer, one layer at a time.

    Other lowerings keep XLA's own layouts (``jax.lax.platform_dependent``): on XLA:GPU the same
    constraint raised the device peak of DeepSeek-V3's mesh-search winner on 128 GB200 past its
    capacity (bench/results/mesh_search.json; tests/test_tpu_kept_layout.py lowers both ways).
    """

    def constrained(vals: dict) -> dict:
        return {n: with_layout_constraint(v, Layout(tuple(range(v.ndim)))) for n, v in vals.items()}

    wide = {n: v for n, v in values.items() if v.ndim >= 2}
    if not wide:
        return values
    return {
        **values,
        **jax.lax.platform_dependent(wide, tpu=constrained, default=lambda vals: vals),
    }


def stored_in_own_layer(name: str) -> bool:
    """Whether :func:`prefetch_scan` stores ``name`` in the layer that makes it (a value made before
    the attention: the rest of the layer follows it) rather than while the next layer computes."""
    return name in N.BEFORE_ATTENTION


# The fewest slots a host stack written and read inside a layer loop (two layers or more) may have.
# With one slot, the store's dynamic-update-slice and the load's dynamic-slice cover the whole
# stack, XLA's simplifier folds them into bitcasts of the stack, and XLA:TPU's host offloader
# leaves the backward's bitcast between a device operand and a host result: the compile fails
# ("Bitcast cannot have different memory spaces").  A second, never-written slot keeps both
# indexed; a whole-stack store without the index ops is not offloaded at all (XLA copies it to
# host and straight back in the same iteration).
MIN_LOOP_SLOTS = 2


def host_slots(name: str, layers: int) -> int:
    """Slots (layers' worth of ``name``) of :func:`prefetch_scan`'s host stack for offloaded
    ``name``: every layer for a name stored in its own layer; all but the last for the others,
    whose last layer stays on device between the passes.  A group of two layers or more gets at
    least :data:`MIN_LOOP_SLOTS` (a two-layer group's later-stored value: its one layer and a spare
    slot nothing writes); a single layer's stack holds only the spare store, which nothing reads,
    and XLA drops it."""
    slots = layers if stored_in_own_layer(name) else layers - 1
    return max(slots, MIN_LOOP_SLOTS) if layers >= 2 else slots


def prefetch_scan(body: LayerBody, keep: Iterable[str], offload: Iterable[str]) -> Callable:
    """``run(x0, stacked_state) -> y``: ``body`` scanned over the layers, differentiable.

    Args:
      body: one layer, ``body(x, layer_state) -> y``; it tags activations with :func:`tags.tag`.
      keep: names saved in device memory between the passes.
      offload: names saved in host memory and prefetched one layer ahead in the backward.
    """
    keep, offload = frozenset(keep), frozenset(offload)
    own = frozenset(n for n in offload if stored_in_own_layer(n))
    later = offload - own
    if not offload:
        raise ValueError(
            "prefetch_scan needs at least one offloaded name; use a checkpoint policy otherwise"
        )

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
        n_layers = jax.tree.leaves(state)[0].shape[0]
        first = jax.tree.map(lambda a: a[0], state)
        shapes = jax.eval_shape(lambda x, p: {n: collect(x, p)[1][n] for n in offload}, x0, first)

        def step(carry, p):
            # i counts the loop's trips, as a scan's own output index does.  Layer i − 1's later
            # values are stored while layer i computes; at i = 0 the zeros go to slot 0, which
            # layer 0's values overwrite at i = 1 (one spare store a step, no branch).
            x, stacks, pending, i = carry
            stacks = _store(stacks, pending, jnp.maximum(i - 1, 0))
            y, values = collect(x, p)
            stacks = _store(stacks, {n: values[n] for n in own}, i)
            kept = _row_major({n: values[n] for n in keep})
            return (y, stacks, {n: values[n] for n in later}, i + 1), (x, kept)

        zeros = {n: jnp.zeros(shapes[n].shape, shapes[n].dtype) for n in later}
        # a stack of at least one slot: a single layer's later value still takes its spare store
        stacks = {
            n: _host_stacks({n: s}, max(host_slots(n, n_layers), 1))[n] for n, s in shapes.items()
        }
        (y, host, last, _), (xs, dev) = jax.lax.scan(step, (x0, stacks, zeros, jnp.int32(0)), state)
        # the later values' last layer stays on device: the backward starts with it
        return y, (xs, dev, host, last, state)

    def run_bwd(res, ct_y):
        xs, dev, host, last, state = res
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

        first = {**_fetch({n: host[n] for n in own}, n_layers - 1), **last}
        idx = jnp.arange(n_layers, dtype=jnp.int32)
        (ct_x0, _), ct_state = jax.lax.scan(
            step, (ct_y, first), (idx, xs, dev, state), reverse=True
        )
        return ct_x0, ct_state

    run.defvjp(run_fwd, run_bwd)
    return run


@dataclass(frozen=True)
class Prefetch:
    """What a layer group runs under a prefetching plan (built by
    :func:`tierax.plan.to_policies`)."""

    keep: frozenset[str]
    offload: frozenset[str]


@dataclass(frozen=True)
class Part:
    """Layers ``start`` … ``stop − 1`` of a segmented group: names kept on device, names offloaded
    (prefetched),
    or, with ``save_all``, every residual of the layer kept (no recomputation); the rest is
    recomputed."""

    start: int
    stop: int
    keep: frozenset[str] = frozenset()
    offload: frozenset[str] = frozenset()
    save_all: bool = False


def segmented_scan(
    body: LayerBody, parts: tuple[Part, ...], scopes: list[str] | None = None
) -> Callable:
    """``run(x0, stacked_state) -> y``: one scan per part over the layers it covers, one custom VJP
    for all.

    Each layer's parameters are read in place from the whole stack (no per-part copy), and the
    backward writes each layer's parameter gradient into one stack-sized buffer carried through
    every part's reverse scan (no per-part gradients to concatenate).  Offloaded names are
    prefetched one layer ahead within a part, as in :func:`prefetch_scan`; ``save_all`` parts keep
    the layer's whole VJP residual set.
    """
    order = sorted(range(len(parts)), key=lambda k: parts[k].start)
    parts = tuple(parts[k] for k in order)
    # Each part's scans run under its own scope (the compile report attributes host buffers by it).
    scopes = [f"tierax_group_{scopes[k]}" if scopes else "tierax_part" for k in order]
    treedefs: dict[int, object] = {}  # save_all parts: the VJP's residual structure, fixed per part

    def layer(state, i):
        return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), state)

    @jax.custom_vjp
    def run(x0, state):
        x = x0
        for q, scope in zip(parts, scopes, strict=False):
            with jax.named_scope(scope):
                x, _ = jax.lax.scan(
                    lambda x, i: (body(x, layer(state, i)), None), x, jnp.arange(q.start, q.stop)
                )
        return x

    def run_fwd(x0, state):
        x, res = x0, []
        for k, q in enumerate(parts):

            def step(carry, i, q=q, k=k):
                x, stacks, j = (
                    # j counts the trips (the store's index), as a scan's own output index does
                    carry
                )
                p = layer(state, i)
                if (
                    q.save_all
                ):  # keep what the VJP keeps, except the layer's input and parameters themselves
                    y, vjp = jax.vjp(body, x, p)
                    leaves, treedef = jax.tree.flatten(vjp)
                    known = {id(v): j for j, v in enumerate([x, *jax.tree.leaves(p)])}
                    where = tuple(known.get(id(v)) for v in leaves)
                    treedefs[k] = (treedef, where)
                    kept = [v for v, w in zip(leaves, where, strict=False) if w is None]
                    return (y, stacks, j + 1), (x, kept)
                y, values = _collect(body, x, p, q.keep | q.offload)
                kept = _row_major({n: values[n] for n in q.keep})
                return (y, _store(stacks, values, j), j + 1), (x, kept)

            shapes = (
                {}
                if q.save_all
                else jax.eval_shape(
                    lambda x, p, q=q: _collect(body, x, p, q.offload)[1], x, layer(state, q.start)
                )
            )
            with jax.named_scope(scopes[k]):
                init = (x, _host_stacks(shapes, q.stop - q.start), jnp.int32(0))
                (x, host, _), (xs, dev) = jax.lax.scan(step, init, jnp.arange(q.start, q.stop))
            res.append((xs, dev, host))
        return x, (tuple(res), state)

    def run_bwd(saved, ct_y):
        res, state = saved
        grads = jax.tree.map(jnp.zeros_like, state)
        ct = ct_y
        for k in reversed(range(len(parts))):
            q, (xs, dev, host) = parts[k], res[k]
            n = q.stop - q.start

            def step(carry, inp, q=q, k=k, host=host):
                ct, current, grads = carry
                j, x, d = inp  # j: index within the part
                p = layer(state, q.start + j)
                upcoming = _fetch(
                    host, jnp.maximum(j - 1, 0)
                )  # layer j − 1's offloaded values, one ahead
                if q.save_all:
                    treedef, where = treedefs[k]
                    known, rest = [x, *jax.tree.leaves(p)], iter(d)
                    leaves = [known[w] if w is not None else next(rest) for w in where]
                    ct_x, ct_p = jax.tree.unflatten(treedef, leaves)(ct)
                else:
                    _, vjp = jax.vjp(lambda x, p: _inject(body, x, p, {**d, **current}), x, p)
                    ct_x, ct_p = vjp(ct)
                grads = jax.tree.map(
                    lambda g, c: jax.lax.dynamic_update_index_in_dim(
                        g, c.astype(g.dtype), q.start + j, 0
                    ),
                    grads,
                    ct_p,
                )
                return (ct_x, upcoming, grads), None

            with jax.named_scope(scopes[k]):
                (ct, _, grads), _ = jax.lax.scan(
                    step, (ct, _fetch(host, n - 1), grads), (jnp.arange(n), xs, dev), reverse=True
                )
        return ct, grads

    run.defvjp(run_fwd, run_bwd)
    return run


def _collect(body, x, p, names):
    """``(body(x, p), the values of the tagged ``names``)``."""
    tape = Tape(collect=names)
    with tape.active():
        y = body(x, p)
    tape.check_complete()
    return y, tape.values


def _inject(body, x, p, saved):
    tape = Tape(inject=saved)
    with tape.active():
        y = body(x, p)
    tape.check_complete()
    return y
