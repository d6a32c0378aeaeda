"""The optimizer update with training state in host memory, streamed layer by layer.

A layer group whose moments a plan offloads (``state: {group: {moments: offload}}``) keeps them in
``pinned_host`` memory between steps (:func:`tierax.plan.state_shardings`).  The update then runs
as a ``lax.scan`` over the group's layers: each iteration reads one layer's moments from the host
(``jax.device_put(x, jax.memory.Space.Device)``), runs the optimizer on that layer's slices on the
device and writes the new moments back (``jax.memory.Space.Host``), so the device holds one
layer's moments at a time instead of the group's.  Everything outside the offloaded groups (the
embedding, the head, groups kept on device, the step counts) is updated by one more call.

The optimizer is called unchanged on each slice, which is exact for an optimizer that acts on each
element on its own given the shared step count — Optax's AdamW, as :func:`tierax.train.step.
make_optimizer` builds it without gradient clipping.  A global gradient-norm clip couples every
element, so a clipped optimizer is refused here rather than streamed inexactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from tierax.errors import TieraxError
from tierax.plan import Placement, Plan, layer_group_of

# Parts of the state the step streams; master weights and the gradient accumulator are placed by
# the planner and priced by the cost model but not yet run by the step.
RUN_KINDS = ("moments",)


def check_runnable(plan: Plan, grad_clip: float | None, where: str) -> None:
    """Refuse state placements the step does not run, before anything is built.

    Raises:
      TieraxError: master weights or the gradient accumulator offloaded, or a clipped optimizer
        with offloaded moments; the message names what runs.
    """
    not_run = sorted(
        f"{g}.{k}" for g, sp in plan.state.items() for k in sp.offloaded if k not in RUN_KINDS
    )
    if not_run:
        raise TieraxError(
            f"{where}: plan {plan.name!r} offloads {', '.join(not_run)}; the step runs offloaded "
            f"moments only (streamed layer by layer); master_weights and grad_accum offload are "
            f"planned and priced (tierax plan, simulate) but not run. Set them to device"
        )
    if grad_clip is not None and plan.offloads_state:
        raise TieraxError(
            f"{where}: plan {plan.name!r} offloads moments, whose update streams layer by layer, "
            f"and the optimizer clips the global gradient norm ({grad_clip}), which couples every "
            f"layer; set the optimizer's grad_clip to none (null) or keep the state on device"
        )


def offloaded_groups(plan: Plan) -> tuple[str, ...]:
    return tuple(g for g, sp in plan.state.items() if sp.moments is Placement.OFFLOAD)


def _empty(x):
    return jnp.zeros((0,), x.dtype)


def _select(tree, group: str | None, streamed: tuple[str, ...]):
    """``tree`` for one call of the optimizer: ``group``'s leaves (None: every leaf outside the
    ``streamed`` groups), the others empty; scalars outside every group (step counts) whole."""

    def pick(path, x):
        g = layer_group_of(path)
        if group is None:
            return _empty(x) if g in streamed else x
        if g == group or (g is None and jnp.ndim(x) == 0):
            return x
        return _empty(x)

    return jax.tree_util.tree_map_with_path(pick, tree)


def _group_index(tree, group: str) -> list[int]:
    return [
        i
        for i, (path, _) in enumerate(jax.tree_util.tree_leaves_with_path(tree))
        if layer_group_of(path) == group
    ]


def _replace(tree, index: list[int], values: list):
    leaves, treedef = jax.tree.flatten(tree)
    for i, v in zip(index, values, strict=True):
        leaves[i] = v
    return jax.tree.unflatten(treedef, leaves)


def streamed_update(optimizer: optax.GradientTransformation, grads, opt_state, params, plan: Plan):
    """(new params, new optimizer state): ``optimizer``'s update with the offloaded groups'
    moments streamed through the device one layer at a time (module docstring)."""
    streamed = offloaded_groups(plan)
    # Everything outside the streamed groups, and the step counts, in one call.
    updates, new_state = optimizer.update(
        _select(grads, None, streamed),
        _select(opt_state, None, streamed),
        _select(params, None, streamed),
    )
    new_params = optax.apply_updates(_select(params, None, streamed), updates)
    for group in streamed:
        g_tree, p_tree, s_tree = (_select(t, group, streamed) for t in (grads, params, opt_state))
        gi, pi, si = (_group_index(t, group) for t in (g_tree, p_tree, s_tree))
        if not pi:
            continue
        leaves = [jax.tree.leaves(t) for t in (g_tree, p_tree, s_tree)]
        g_xs, p_stack, s_xs = (
            [lv[i] for i in idx] for lv, idx in zip(leaves, (gi, pi, si), strict=True)
        )
        num_layers = p_stack[0].shape[0]

        def layer(p_stack, xs_l, g_tree=g_tree, p_tree=p_tree, s_tree=s_tree, gi=gi, pi=pi, si=si):
            k, g_l, s_l = xs_l
            p_l = [x[k] for x in p_stack]
            s_l = [jax.device_put(x, jax.memory.Space.Device) for x in s_l]  # this layer's in
            upd, s_new = optimizer.update(
                _replace(g_tree, gi, g_l), _replace(s_tree, si, s_l), _replace(p_tree, pi, p_l)
            )
            p_new = jax.tree.leaves(optax.apply_updates(_replace(p_tree, pi, p_l), upd))
            # The parameters are updated in place (the scan's carry); the moments go back out.
            p_stack = [x.at[k].set(p_new[i]) for x, i in zip(p_stack, pi, strict=True)]
            s_out = [jax.device_put(jax.tree.leaves(s_new)[i], jax.memory.Space.Host) for i in si]
            return p_stack, s_out

        p_stack, s_stack = jax.lax.scan(layer, p_stack, (jnp.arange(num_layers), g_xs, s_xs))
        new_params = _replace(new_params, pi, p_stack)
        new_state = _replace(new_state, si, s_stack)
    return new_params, new_state
