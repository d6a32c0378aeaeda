"""The optimizer update with training state in host memory, streamed layer by layer.

A layer group whose moments a plan offloads (``state: {group: {moments: offload}}``) keeps them in
``pinned_host`` memory between steps (:func:`tierax.plan.state_shardings`); one whose master
weights it offloads keeps its cast parameters' float32 masters there and a compute-dtype copy of
them on the device (:mod:`tierax.train.masters`).  The update then runs as a ``lax.scan`` over the
group's layers: each iteration reads one layer's host parts (``jax.device_put(x,
jax.memory.Space.Device)``), runs the optimizer on that layer's slices on the device and writes
the new moments and masters back (``jax.memory.Space.Host``) and the new compute copy into the
device's, so the device holds one layer's host state at a time instead of the group's.  The parts
on the device (the group's other parameters, its moments when only masters are offloaded, the
compute copy) are updated in place.  Everything outside the streamed groups (the embedding, the
head, groups kept on device, the step counts) is updated by one more call.

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

from tierax.plan import Placement, Plan, layer_group_of
from tierax.train import masters

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


def offloaded_groups(plan: Plan) -> tuple[str, ...]:
    """The layer groups whose update streams: moments or master weights offloaded."""
    return tuple(
        g
        for g, sp in plan.state.items()
        if Placement.OFFLOAD in (sp.moments, sp.master_weights)
    )


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
    compute: dict | None = None,
):
    """(new params, new optimizer state, new compute copies): ``optimizer``'s update with the
    offloaded groups' moments and master weights streamed through the device one layer at a time
    (module docstring).

    ``clipped``: ``optimizer`` clips the global gradient norm with :func:`clip_by_global_norm`
    (``make_optimizer(grad_clip=...)``); the norm of all of ``grads`` is then taken first and given
    to every slice's update (an optimizer that ignores ``global_grad_norm`` would clip each slice
    by its own norm: give it this module's clip).  ``compute``: the device's compute-dtype copies
    of the host masters (:mod:`tierax.train.masters`), each rewritten from its new master layer by
    layer; None when no master is offloaded."""
    streamed = offloaded_groups(plan)
    compute = dict(compute or {})
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
    paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    for group in streamed:
        g_tree, p_tree, s_tree = (_select(t, group, streamed) for t in (grads, params, opt_state))
        gi, pi, si = (_group_index(t, group) for t in (g_tree, p_tree, s_tree))
        if not pi:
            continue
        leaves = [jax.tree.leaves(t) for t in (g_tree, p_tree, s_tree)]
        # Host parts stream (scan inputs in, outputs out); device parts are updated in place (the
        # scan's carry).  hp: parameters whose masters are on the host, each with a device copy.
        hp = [i for i in pi if masters.offloaded(plan, paths[i])]
        dp = [i for i in pi if i not in hp]
        host_moments = plan.state_of(group).moments is Placement.OFFLOAD
        keys = [masters.key_of(paths[i]) for i in hp]
        carry0 = (
            [leaves[1][i] for i in dp],
            [compute[k] for k in keys],
            [] if host_moments else [leaves[2][i] for i in si],
        )
        xs = (
            [leaves[0][i] for i in gi],
            [leaves[1][i] for i in hp],
            [leaves[2][i] for i in si] if host_moments else [],
        )
        num_layers = leaves[1][pi[0]].shape[0]

        def layer(
            carry, xs_l, g_tree=g_tree, p_tree=p_tree, s_tree=s_tree, gi=gi, pi=pi, si=si,
            hp=hp, dp=dp, host_moments=host_moments,
        ):  # fmt: skip
            dev_p, copies, dev_s = carry
            k, (g_l, hp_l, hs_l) = xs_l
            p_of = dict(zip(dp, (x[k] for x in dev_p), strict=True))
            # This layer's host masters and moments in.
            loaded = [jax.device_put(x, jax.memory.Space.Device) for x in hp_l]
            p_of |= dict(zip(hp, loaded, strict=True))
            if host_moments:
                s_l = [jax.device_put(x, jax.memory.Space.Device) for x in hs_l]
            else:
                s_l = [x[k] for x in dev_s]
            p_l = [p_of[i] for i in pi]
            upd, s_new = optimizer.update(
                _replace(g_tree, gi, g_l),
                _replace(s_tree, si, s_l),
                _replace(p_tree, pi, p_l),
                **extra,
            )
            p_new = jax.tree.leaves(optax.apply_updates(_replace(p_tree, pi, p_l), upd))
            s_new = jax.tree.leaves(s_new)
            dev_p = [x.at[k].set(p_new[i]) for x, i in zip(dev_p, dp, strict=True)]
            copies = [
                x.at[k].set(p_new[i].astype(x.dtype)) for x, i in zip(copies, hp, strict=True)
            ]
            hp_out = [jax.device_put(p_new[i], jax.memory.Space.Host) for i in hp]
            if host_moments:  # the new moments go back out
                hs_out = [jax.device_put(s_new[i], jax.memory.Space.Host) for i in si]
            else:
                hs_out, dev_s = [], [x.at[k].set(s_new[i]) for x, i in zip(dev_s, si, strict=True)]
            return (dev_p, copies, dev_s), (hp_out, hs_out)

        (dev_p, copies, dev_s), (hp_new, hs_new) = jax.lax.scan(
            layer, carry0, (jnp.arange(num_layers), xs)
        )
        new_params = _replace(_replace(new_params, dp, dev_p), hp, hp_new)
        new_state = _replace(new_state, si, hs_new if host_moments else dev_s)
        compute |= dict(zip(keys, copies, strict=True))
    return new_params, new_state, (compute or None)
