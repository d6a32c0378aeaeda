"""MaxText's own program, traced: an activation :class:`~tierax.tracing.inventory.Inventory` of the
scanned layer stacks MaxText's decoder builds, nothing allocated.

* The model is MaxText's (``model_creation_utils.create_nnx_abstract_model``: ``nnx.eval_shape``).
* Every scanned stack of its decoder (``layers``; DeepSeek's ``dense_layers`` and ``moe_layers``;
  Gemma 3 / GPT-OSS / Llama 4's scanned blocks of several layers, plus a Gemma 3
  ``layers_remainder`` block applied once) is one layer group, named as MaxText names the stack.
  Its layer (or block: then one "layer" of the group is one scanned block) is MaxText's own
  module, called as MaxText's scan body calls it (``layer(y, decoder_segment_ids,
  decoder_positions, deterministic, model_mode)``), one layer's parameters sliced off the
  stack's scan axis; :func:`tierax.tracing.inventory.layer_inventory` traces it, so the
  activation names are MaxText's ``checkpoint_name`` tags.
* With ``attention=flash`` (what a TPU target traces: splash attention, a kernel MaxText picks by
  the mesh's platform and that lowers for a TPU only) MaxText's kernel call is replaced by
  :mod:`.attention_standin`'s stand-in while the layer is traced (:func:`attention_kernel`).
* The layer is traced on a one-device mesh at one device's batch: ``per_device_batch_size`` × the
  tensor axis sequences (the devices of a tensor group share their sequences) ×
  ``max_target_length``.
  With tensor parallelism every per-layer figure (bytes, FLOPs, HBM traffic, parameters) is then
  divided by the tensor axis: MaxText's logical axis rules (base.yml) shard each layer activation
  over ``tensor`` — the residual stream by ``activation_embed``, attention by ``activation_heads``,
  the MLP by ``activation_mlp`` — and its weights with them (:func:`.config.check_priceable` refuses
  other rules).  Tracing MaxText's layer at a tensor shard's widths would mean editing its config's
  head counts and widths, i.e. re-describing its model.  Expert parallelism keeps the traced
  figures: a device computes its experts for as many routed tokens as its own tokens route.
* Parameter, gradient and optimizer bytes per device are MaxText's abstract train state's
  (``maxtext_utils.get_abstract_state_nnx`` with MaxText's optimizer, on an abstract mesh of the
  run's sizes): each leaf's shard shape under MaxText's shardings, in its own dtype; gradients in
  ``grad_dtype``.  The logits are one ``num_vocab_tiling``-th of [tokens, vocab] per device, split
  over tensor (``activation_vocab``), float32 where ``cast_logits_to_fp32``.
* Not modelled here: collective bytes (0), the loss's HBM traffic (0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math

from tierax.errors import TieraxError
from tierax.interop.maxtext_program import attention_standin
from tierax.interop.maxtext_program.abstract_state import abstract_state
from tierax.tracing.inventory import GroupInventory, Inventory, layer_inventory

# Decoder submodules outside every layer stack (embedding side, final norm, head).
OUTSIDE = frozenset(
    {"decoder_norm", "logits_dense", "dropout", "positional_embedding", "position_embedder"}
)
# Non-parameter layer state (RNG keys, MoE routing biases) is materialised as zeros for the trace;
# above this it is refused rather than allocated.
MAX_STATE_BYTES = 64 * 2**20
# Fields of the per-layer records that are not divided by the tensor axis.
_UNSCALED = frozenset({"num_layers", "fp8_flops_share", "residual", "expert_param_count_per_layer"})


def program_inventory(loaded, stacked_bytes=None) -> Inventory:
    """The inventory of ``loaded``'s program (a :class:`.config.Loaded`), per device;
    ``stacked_bytes``: the bytes a saved value takes in its layer stack on the target
    (:func:`tierax.tracing.inventory.layer_inventory`; None: its logical bytes)."""
    import jax
    from flax.linen import partitioning as nn_partitioning

    config = loaded.config
    state = abstract_state(config)
    model = _abstract_model(config, _one_device_mesh(config))
    tensor = loaded.mesh["tensor"]
    x = jax.ShapeDtypeStruct((loaded.microbatch, loaded.seq, config.emb_dim), config.dtype)
    groups = []
    # MaxText's code relies on NumPy rank promotion (JAX's default), whatever the caller set.
    with (
        nn_partitioning.axis_rules(config.logical_axis_rules),
        jax.numpy_rank_promotion("allow"),
        attention_kernel(config),
    ):
        for name, stack in decoder_stacks(model.decoder, config):
            fn, params, num_layers = _layer(stack, config)
            try:
                gi = layer_inventory(
                    fn, x, params, group=name, num_layers=num_layers, stacked_bytes=stacked_bytes
                )
            except TieraxError:
                raise
            except Exception as e:  # MaxText's layer did not trace on this machine
                raise TieraxError(
                    f"MaxText's {name} layer ({type(stack).__name__}) did not trace on a CPU: "
                    f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
                ) from None
            groups.append(per_tensor_shard(gi, tensor))
    names = [g.name for g in groups]
    return _with_state(loaded, _with_experts(groups, state, tensor), state, names)


def _with_experts(groups: list[GroupInventory], state, tensor: int) -> list[GroupInventory]:
    """``groups`` with each one's routed-expert parameters per layer (per tensor shard, as its
    ``layer_param_count``) read from MaxText's train state: the cost model gathers a layer's
    ``E / expert`` local experts under FSDP, its other weights whole
    (:func:`tierax.costmodel.fixed._group_workspace`); without the count every expert would be
    priced as gathered on every device under expert parallelism."""
    from tierax.interop.maxtext_program import weight_stacks

    stacks = weight_stacks.state_stacks(state, {g.name for g in groups})
    return [
        dataclasses.replace(
            g,
            expert_param_count_per_layer=weight_stacks.expert_params_per_layer(stacks, g.name)
            // tensor,
        )
        for g in groups
    ]


def attention_kernel(config):
    """The context the layer is traced in: with ``attention=flash`` (splash attention, the kernel a
    TPU runs) MaxText's attention op runs :func:`.attention_standin.splash_stand_in`, which traces
    on a CPU for any head dims and with attention sinks; other kernels run as MaxText's code
    does."""
    if str(config.attention) == attention_standin.KERNEL:
        return attention_standin.standing_in()
    return contextlib.nullcontext()


def _one_device_mesh(config):
    import jax
    import numpy as np
    from jax.sharding import Mesh

    axes = tuple(config.mesh_axes)
    return Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(axes)), axes)


def _abstract_model(config, mesh):
    from maxtext.utils import model_creation_utils

    _, model = model_creation_utils.create_nnx_abstract_model(config, mesh)
    return model


def decoder_stacks(decoder, config) -> list[tuple[str, object]]:
    """(attribute name, module) of each layer stack of MaxText's decoder that holds parameters, in
    the order the decoder builds them (its attribute order)."""
    from flax import nnx

    out = []
    for name, value in vars(decoder).items():
        if name in OUTSIDE or not isinstance(value, nnx.Module):
            continue
        if not jax_leaves(nnx.state(value, nnx.Param)):
            continue  # e.g. Gemma 3's remainder block when the layers divide the pattern
        out.append((name, value))
    if not out:
        raise TieraxError(
            f"MaxText's decoder ({config.decoder_block}) holds no layer stack tierax can trace"
        )
    return out


def jax_leaves(tree) -> list:
    import jax

    return jax.tree.leaves(tree)


def _scan_length(params, config) -> int | None:
    """The stack's scan length (None: not a scanned stack), from MaxText's scan metadata."""
    import jax
    from flax import nnx

    for var in jax.tree.leaves(params, is_leaf=lambda v: isinstance(v, nnx.Variable)):
        if isinstance(var, nnx.Variable) and var.get_metadata().get(nnx.PARTITION_NAME):
            value = var.get_value()
            axis = config.param_scan_axis if value.ndim > config.param_scan_axis else 0
            return int(value.shape[axis])
    return None


def _layer(stack, config):
    """(layer_fn(x, params) -> y, one layer's abstract parameters, layers in the group)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params, rest = nnx.split(stack, nnx.Param, ...)
    length = _scan_length(params, config)
    if length is not None:  # one layer: the scan axis sliced off, as MaxText's scan body sees it
        ax = config.param_scan_axis

        def drop(v, axis):
            return jax.ShapeDtypeStruct(v.shape[:axis] + v.shape[axis + 1 :], v.dtype)

        params = jax.tree.map(lambda v: drop(v, ax if v.ndim > ax else 0), params)
        rest = jax.tree.map(lambda v: drop(v, 0) if v.ndim else v, rest)
        params = _remove_scan_axis(params)
        rest = _remove_scan_axis(rest)
    rest = _concrete(rest)
    kwargs = {
        k: None
        for k in ("slot", "previous_chunk", "bidirectional_mask")
        if k in inspect.signature(type(stack).__call__).parameters
    }
    deterministic = not config.enable_dropout

    def layer_fn(x, p):
        layer = nnx.merge(graphdef, p, rest)
        segments = jnp.ones(x.shape[:2], jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32), x.shape[:2])
        out = layer(x, segments, positions, deterministic, "train", **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return layer_fn, params, length or 1


def _remove_scan_axis(tree):
    from maxtext.utils import maxtext_utils_nnx

    try:
        return maxtext_utils_nnx.nnx_remove_scan_axis(tree)
    except (ValueError, TypeError):
        return tree  # metadata only: MaxText's logical names, not shapes


def _concrete(rest):
    """The non-parameter layer state (RNG keys and counts, MoE routing biases) as zeros."""
    import jax
    import jax.numpy as jnp

    leaves = jax.tree.leaves(rest)
    size = sum(
        math.prod(v.shape) * (0 if _is_key(v) else jnp.dtype(v.dtype).itemsize) for v in leaves
    )
    if size > MAX_STATE_BYTES:
        raise TieraxError(
            f"MaxText's layer holds {size / 2**20:.0f} MiB of non-parameter state; tierax "
            "materialises at most 64 MiB of it to trace the layer"
        )

    def make(v):
        if _is_key(v):
            keys = jax.random.split(jax.random.key(0), max(1, math.prod(v.shape)))
            return keys.reshape(v.shape) if v.shape else keys[0]
        return jnp.zeros(v.shape, v.dtype)

    return jax.tree.map(make, rest)


def _is_key(v) -> bool:
    import jax
    import jax.numpy as jnp

    return jnp.issubdtype(v.dtype, jax.dtypes.prng_key)


def per_tensor_shard(gi: GroupInventory, tensor: int) -> GroupInventory:
    """``gi`` with every per-layer figure divided by ``tensor`` (see the module docstring)."""
    if tensor == 1:
        return gi

    def scaled(obj):
        changes = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name in _UNSCALED or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            changes[f.name] = v // tensor if isinstance(v, int) else v / tensor
        return dataclasses.replace(obj, **changes)

    acts = tuple(scaled(a) for a in gi.activations)
    out = scaled(gi)
    return dataclasses.replace(
        out,
        activations=acts,
        weight_hbm_bytes=tuple((k, v / tensor) for k, v in gi.weight_hbm_bytes),
    )


def _with_state(loaded, groups: list[GroupInventory], state, names: list[str]) -> Inventory:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    config = loaded.config
    params = nnx.state(state.model, nnx.Param)
    per_group: dict = {}
    param_bytes = per_device_params = outside = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        group = keys[1] if len(keys) > 1 and keys[0] == "decoder" and keys[1] in names else None
        local = math.prod(leaf.sharding.shard_shape(leaf.shape))
        per_device_params += local
        param_bytes += local * jnp.dtype(leaf.dtype).itemsize
        if group is None:
            outside += math.prod(leaf.shape)
        else:
            per_group[group] = per_group.get(group, 0) + local
    optimizer_bytes = sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(state.optimizer)
        if hasattr(leaf, "sharding") and not _is_key(leaf)
    )
    logit_item = 4 if config.cast_logits_to_fp32 else jnp.dtype(config.dtype).itemsize
    tokens = loaded.microbatch * loaded.seq
    tiles = config.num_vocab_tiling * loaded.mesh["tensor"]
    logits = tokens * config.vocab_size * logit_item // tiles
    return Inventory(
        model=loaded.model,
        microbatch=loaded.microbatch,
        seq=loaded.seq,
        mesh=dict(loaded.mesh),
        groups=tuple(groups),
        param_bytes=int(param_bytes),
        grad_bytes=int(per_device_params * jnp.dtype(config.grad_dtype).itemsize),
        optimizer_bytes=int(optimizer_bytes),
        logits_bytes=int(logits),
        embed_param_count=int(outside),
        group_param_counts=tuple((g, per_group.get(g, 0)) for g in names),
        moment_bytes_per_param=int(round(optimizer_bytes / max(1, per_device_params))),
    )
