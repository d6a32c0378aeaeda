"""Master weights in host memory: the float32 masters between steps on the host, a compute-dtype
copy on the device for the forward and backward.

A layer group whose ``master_weights`` a plan offloads keeps, of its parameters, those the model
casts to the compute dtype before any use (:func:`tierax.models.layers.cast_before_use`: the
projection kernels and the routed experts' weights) in ``pinned_host`` memory between steps
(:func:`tierax.plan.state_shardings` with ``master_weights``).  The device keeps each of them
already cast to ``cfg.dtype`` (:attr:`tierax.train.step.TrainState.compute_params`, keyed by the
leaf's tree path); the loss runs on the parameters with those copies in place of the masters
(:func:`forward_params`).  The copy gives the forward the values the model's own cast would, and
the gradient with respect to it, cast to the master's dtype, is the gradient with respect to the
master (the cast's transpose is a cast).  The group's other parameters (norm scales, the router,
fp8 metas), which the model uses as they are, stay on the device.

The streamed update (:func:`tierax.train.streamed.streamed_update`) loads each layer's masters,
updates them on the device, writes them back to the host and the new copy into the device's: per
step the offloaded masters cross the host link once each way.  The copy is derived state: a
checkpoint saves the masters only and a restore casts the copy again (:func:`derive`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tierax.models.layers import cast_before_use
from tierax.plan import Placement, Plan, layer_group_of

# The key of a leaf in a TrainState's compute_params: its tree path in the parameters.
key_of = jax.tree_util.keystr


def offloads_masters(plan: Plan) -> bool:
    return any(sp.master_weights is Placement.OFFLOAD for sp in plan.state.values())


def offloaded(plan: Plan, path) -> bool:
    """Whether the parameter at ``path`` has its master in host memory under ``plan``."""
    group = layer_group_of(path)
    return (
        group is not None
        and plan.state_of(group).master_weights is Placement.OFFLOAD
        and cast_before_use(path)
    )


def compute_shapes(plan: Plan, cfg, params) -> dict | None:
    """The compute copies' ``ShapeDtypeStruct``s (``params``: arrays or ShapeDtypeStructs with
    shardings), each on the device memory of its master's sharding; None when ``plan`` offloads
    no master weights."""
    if not offloads_masters(plan):
        return None
    dt = jnp.dtype(cfg.dtype)
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        if offloaded(plan, path):
            s = getattr(x, "sharding", None)
            s = None if s is None else s.with_memory_kind("device")
            out[key_of(path)] = jax.ShapeDtypeStruct(x.shape, dt, sharding=s)
    return out


def derive(params, like: dict | None) -> dict | None:
    """The compute copies of ``params`` (masters, on the host or the device) that ``like`` names
    (a compute_params dict of arrays or ShapeDtypeStructs: dtypes and shardings), each cast on the
    device; None for None."""
    if like is None:
        return None
    masters = {key_of(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    out = {}
    for k, t in like.items():
        x = masters[k]
        on_device = jax.device_put(x, x.sharding.with_memory_kind("device"))
        out[k] = jax.device_put(on_device.astype(t.dtype), t.sharding)
    return out


def forward_params(params, compute: dict | None):
    """``params`` with each compute copy in ``compute`` in place of its master: what the loss
    runs on."""
    if not compute:
        return params
    return jax.tree_util.tree_map_with_path(lambda p, x: compute.get(key_of(p), x), params)


def to_master_dtypes(grads, params):
    """Gradients taken with respect to :func:`forward_params`, cast to the masters' dtypes."""
    return jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
