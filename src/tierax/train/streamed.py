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
make_optimizer` builds it.  A global gradient-norm clip couples every element: its norm needs every
gradient before any layer's update.  The update therefore runs in two passes when the optimizer
clips: the first takes the norm of the whole gradient tree (all of it is on the device after the
backward pass), the second streams the layers and hands that norm to every slice's update
(:func:`clip_by_global_norm` takes it as the extra argument ``global_grad_norm``), so each slice is
scaled by the global factor, not its own.
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
# Optax's global norm (optax.tree.norm; optax.global_norm in releases before it).
_tree_norm = getattr(getattr(optax, "tree", None), "norm", None) or optax.global_norm


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
    """Optax's ``clip_by_global_norm`` (the same norm, test and scaling), whose update also takes
    the norm from outside: ``update(g, state, params, global_grad_norm=n)`` scales ``g`` by the
    clip factor of ``n`` instead of ``g``'s own norm — what the streamed update passes each layer's
    slice (module docstring).  Without ``global_grad_norm`` it is Optax's transform."""

    def update(updates, state, params=None, *, global_grad_norm=None, **extra):
        del params, extra
        g_norm = _tree_norm(updates) if global_grad_norm is None else global_grad_norm
        trigger = jnp.squeeze(g_norm < max_norm)

        def clip(t):
            return jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)


def check_runnable(plan: Plan, grad_clip: float | None, where: str) -> None:
    """Refuse state placements the step does not run, before anything is built.

    ``grad_clip`` (the optimizer's global-norm clip) runs with streamed moments in two passes
    (module docstring); it is taken for the callers' sake and refuses nothing.

    Raises:
      TieraxError: master weights or the gradient accumulator offloaded; the message names what
        runs.
    """
    not_run = sorted(
        f"{g}.{k}" for g, sp in plan.state.items() for k in sp.offloaded if k not in RUN_KINDS
    )
    if not_run:
        raise TieraxError(
            f"{where}: plan {plan.name!r} offloads {', '.join(not_run)}; the step runs offloaded "
            f"moments only (streamed layer by layer); master_weights offload is planned and priced "
            f"(tierax plan, simulate) but not run, grad_accum offload neither priced nor run. Set "
            f"them to device"
        )
    del grad_clip


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


def streamed_update(
    optimizer: optax.GradientTransformation,
    grads,
    opt_state,
    params,
    plan: Plan,
    *,
    clipped: bool = False,
):
    """(new params, new optimizer state): ``optimizer``'s update with the offloaded groups'
    moments streamed through the device one layer at a time (module docstring).

    ``clipped``: ``optimizer`` clips the global gradient norm with :func:`clip_by_global_norm`
    (``make_optimizer(grad_clip=...)``); the norm of all of ``grads`` is then taken first and given
    to every slice's update (an optimizer that ignores ``global_grad_norm`` would clip each slice
    by its own norm: give it this module's clip)."""
    streamed = offloaded_groups(plan)
    # Pass one (clipped only): the norm of every gradient, before any layer is updated.
    extra = {"global_grad_norm": _tree_norm(grads)} if clipped else {}
    # Everything outside the streamed groups, and the step counts, in one call.
    updates, new_state = optimizer.update(
        _select(grads, None, streamed),
        _select(opt_state, None, streamed),
        _select(params, None, streamed),
        **extra,
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
                _replace(g_tree, gi, g_l),
                _replace(s_tree, si, s_l),
                _replace(p_tree, pi, p_l),
                **extra,
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
