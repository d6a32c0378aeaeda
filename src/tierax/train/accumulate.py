"""Gradient accumulation: a step with several microbatches per optimizer update sums their
gradients in a float32 accumulator, on the device or, for a layer group whose ``grad_accum`` a plan
offloads (``state: {group: {grad_accum: offload}}``), in pinned host memory.

On the device the accumulator is the carry of a ``lax.scan`` over the microbatches, zeros at the
start.  Offloaded, a group's accumulator is a carry of the same scan in host memory, and after each
microbatch's backward pass a ``lax.scan`` over the group's layers loads one layer's slice
(``jax.device_put(x, jax.memory.Space.Device)``), adds the microbatch's float32 gradient on the
device and writes the sum back (``jax.memory.Space.Host``); after the last microbatch the sums are
loaded for the update.  Per step ``A`` microbatches move the offloaded groups' float32 gradients
``A + 1`` times each way: ``A`` loads and stores, the final load, and the zeros the accumulator
starts from, which XLA writes from the device (what :mod:`tierax.costmodel.state` prices).  The
device holds the microbatch's gradients and one layer's slice of the accumulator instead of the
whole accumulator beside them.  The sums are the device accumulator's, in the same order, so the
two forms give the same bits.

Why not ``A − 1`` transfers each way (the first microbatch stored without a load, the last one's
sum left on the device): that needs the first and the last microbatch written out of the scan, and
XLA then fuses the zero-initialisations of their layer scans' residual stacks into one fusion, so
two microbatches' activation stacks are live at once (tiny-llama on h200 at 2 × 128: device temp
9.6 MB against the device accumulator's 6.0 MB; an optimization barrier between the microbatches
does not order a constant's initialisation).  The single scan keeps one microbatch's activations.

fp8 delayed-scaling metas (:mod:`tierax.models.fp8`) combine by maximum and stay on the device.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from tierax.errors import TieraxError
from tierax.models import fp8
from tierax.plan import Placement, Plan, layer_group_of


def offloaded_groups(plan: Plan) -> tuple[str, ...]:
    """The layer groups whose accumulator ``plan`` places in host memory."""
    return tuple(g for g, sp in plan.state.items() if sp.grad_accum is Placement.OFFLOAD)


def check_runs(plan: Plan, grad_accum: int, where: str) -> None:
    """Refuse an offloaded accumulator in a step with one microbatch per update (it has none).

    Raises:
      TieraxError: naming the groups and the two ways out.
    """
    groups = offloaded_groups(plan)
    if groups and grad_accum < 2:
        raise TieraxError(
            f"{where}: plan {plan.name!r} offloads the gradient accumulator of "
            f"{', '.join(groups)}, but the step runs one microbatch per update (grad_accum = "
            f"{grad_accum}), which accumulates nothing; set grad_accum > 1 or grad_accum: device"
        )


def _is_meta(x) -> bool:
    return isinstance(x, fp8.Fp8Meta)


def _combine(a, b):
    """One leaf of the accumulator with a microbatch's (both float32): metas by maximum."""
    return jax.tree.map(jnp.maximum, a, b) if _is_meta(a) else a + b


def _to_f32(grads):
    return jax.tree.map(lambda g: g.astype(jnp.float32), grads)


def _layers(fn: Callable, *stacks):
    """``fn`` applied to each layer's slices of ``stacks`` (lists of arrays stacked on the layer
    axis) by a ``lax.scan``: the stacked results."""
    _, out = jax.lax.scan(lambda _, xs: (None, fn(*xs)), None, stacks)
    return out


def _add_store(acc, g):
    def add(hs, gs):
        return [
            jax.device_put(jax.device_put(h, jax.memory.Space.Device) + x, jax.memory.Space.Host)
            for h, x in zip(hs, gs, strict=True)
        ]

    return _layers(add, acc, g)


def accumulate(grad_fn: Callable, params, xs: tuple, plan: Plan, param_shardings=None):
    """(loss summed over the microbatches, float32 gradients summed, fp8 metas by maximum).

    ``xs``: the microbatches' inputs, each ``[grad_accum, ...]``; ``grad_fn(params, *x)`` returns
    one microbatch's (loss, gradients).  ``param_shardings``: the device accumulator's (FSDP),
    None to let XLA choose.  Offloaded groups: :func:`offloaded_groups` (module docstring)."""
    streamed = offloaded_groups(plan)
    if not streamed:
        return _on_device(grad_fn, params, xs, param_shardings)
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_meta)
    host: dict[str, list[int]] = {}
    for i, (path, leaf) in enumerate(paths_leaves):
        group = layer_group_of(path)
        if group in streamed and not _is_meta(leaf):
            host.setdefault(group, []).append(i)
    on_host = {i for idx in host.values() for i in idx}
    dev = [i for i in range(len(paths_leaves)) if i not in on_host]

    def micro(carry, x):
        loss_sum, acc_dev, acc_host = carry
        loss, grads = grad_fn(params, *x)
        g = treedef.flatten_up_to(_to_f32(grads))
        acc_dev = [_combine(a, g[i]) for a, i in zip(acc_dev, dev, strict=True)]
        acc_host = {
            grp: _add_store(acc_host[grp], [g[i] for i in idx]) for grp, idx in host.items()
        }
        return (loss_sum + loss, acc_dev, acc_host), None

    zeros = treedef.flatten_up_to(_zeros(params, param_shardings))
    host0 = {
        grp: [jax.device_put(zeros[i], jax.memory.Space.Host) for i in idx]
        for grp, idx in host.items()
    }
    carry = (jnp.zeros((), jnp.float32), [zeros[i] for i in dev], host0)
    (loss_sum, acc_dev, acc_host), _ = jax.lax.scan(micro, carry, xs)
    leaves: list = [None] * len(paths_leaves)
    for a, i in zip(acc_dev, dev, strict=True):
        leaves[i] = a
    for grp, idx in host.items():
        for i, h in zip(idx, acc_host[grp], strict=True):
            leaves[i] = jax.device_put(h, jax.memory.Space.Device)
    return loss_sum, jax.tree.unflatten(treedef, leaves)


def _zeros(params, param_shardings):
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if param_shardings is not None:  # keep the accumulator FSDP-sharded like its parameter
        zeros = jax.lax.with_sharding_constraint(zeros, param_shardings)
    return zeros


def _on_device(grad_fn: Callable, params, xs: tuple, param_shardings):
    def micro(carry, x):
        loss_sum, grad_sum = carry
        loss, grads = grad_fn(params, *x)
        # fp8 delayed-scaling state combines by maximum (its "gradient" is its next value).
        return (loss_sum + loss, fp8.combine_meta(grad_sum, _to_f32(grads))), None

    zeros = _zeros(params, param_shardings)
    (loss_sum, grad_sum), _ = jax.lax.scan(micro, (jnp.zeros((), jnp.float32), zeros), xs)
    return loss_sum, grad_sum
