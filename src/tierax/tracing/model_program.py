"""The front end for tierax's own models: a model config, its traced inventory and a mesh as the
:class:`~tierax.tracing.program.Program` the cost model prices.

Everything the cost model needs from a model config is read here, once: the layer groups, the
dtypes, the hidden width, the LM head's shape and loss tiling, cuDNN attention's workspace inputs,
the MoE layers' backward buffers (:func:`tierax.models.moe.backward_buffer_bytes`), XLA:GPU's
transposed weight-stack copies (:func:`transposed_stack_params`) and the model FLOPs
(:func:`tierax.models.flops.train_flops`).  A new model family adds its reading here; the cost
model does not change.
"""

from __future__ import annotations

import functools

from tierax.models import moe
from tierax.models.flops import train_flops
from tierax.sharding import gather_layout
from tierax.tracing import inventory as inv_lib
from tierax.tracing.inventory import Inventory
from tierax.tracing.program import FusedAttention, Head, Program

# The model families whose weights' layout tierax knows (tierax.sharding.rules): their stacked
# weights' transposed copies are priced.
LAID_OUT_FAMILIES = ("llama", "deepseek")


def program_of(cfg, microbatch: int, seq: int, mesh: dict | None = None) -> Program:
    """``cfg``'s step at ``microbatch`` sequences of ``seq`` tokens per device on ``mesh``: its
    inventory traced (:func:`tierax.tracing.inventory.model_inventory`) and the rest read from
    the config (:func:`for_inventory`)."""
    return for_inventory(cfg, inv_lib.model_inventory(cfg, microbatch, seq, mesh))


def for_inventory(cfg, inv: Inventory) -> Program:
    """``cfg``'s program over the inventory ``inv`` (traced from ``cfg`` or given: a synthetic
    inventory of ``cfg``'s groups prices as tierax's model would)."""
    tokens = inv.microbatch * inv.seq
    ep = inv.mesh.get("expert", 1)
    head = Head(cfg.d_model, cfg.vocab_size, cfg.loss_tiles) if cfg.vocab_size else None
    attention = None
    if cfg.attention in ("cudnn", "splash"):  # the fused kernels, priced at the program's shape
        _, dqk, _ = cfg.attention_dims()
        attention = FusedAttention(cfg.attention, cfg.num_heads // inv.mesh.get("tensor", 1), dqk)
    moe_bytes = tuple(
        (g.name, moe.backward_buffer_bytes(cfg, tokens, ep))
        for g in inv.groups
        if g.expert_param_count_per_layer
    )
    return Program(
        inventory=inv,
        groups=tuple(cfg.layer_groups()),
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        hidden=cfg.d_model,
        model_flops=train_flops(cfg, inv.microbatch, inv.seq),
        head=head,
        attention=attention,
        moe_backward_bytes=moe_bytes,
        stack_copy_params=transposed_stack_params(cfg, inv.mesh),
        one_layer_groups_offload=False,
    )


def transposed_stack_params(cfg, mesh: dict) -> float:
    """Per-device parameters of ``cfg``'s stacked weights gathered through a transposed copy
    (:func:`tierax.sharding.gather_layout.transposed_params`; 0 for a family whose weights' layout
    is not known)."""
    if cfg.family not in LAID_OUT_FAMILIES:
        return 0.0
    return _stack_params(cfg, tuple(sorted(mesh.items())))


@functools.lru_cache(maxsize=64)
def _stack_params(cfg, mesh_items) -> float:
    from flax import nnx

    from tierax.models import abstract_model

    _, abstract = nnx.split(abstract_model(cfg))
    return gather_layout.transposed_params(abstract, dict(mesh_items))


def takes_program(position: int):
    """Refuse anything but a :class:`Program` at the decorated function's argument ``position``
    (given by position or as ``prog``) before the function runs: the cost model and the planner
    price a program, never a model config, so an ``(inventory, config)`` pair fails here with the
    front end that builds the program from them."""

    def wrap(fn):
        @functools.wraps(fn)
        def checked(*args, **kwargs):
            given = len(args) > position or "prog" in kwargs  # missing: Python's own error
            value = args[position] if len(args) > position else kwargs.get("prog")
            if given and not isinstance(value, Program):
                raise TypeError(
                    f"{fn.__module__}.{fn.__name__} takes a Program, not "
                    f"{type(value).__name__} (tierax.tracing.model_program.for_inventory(cfg, "
                    "inventory) builds one from a tierax config and its inventory, "
                    "program_of(cfg, microbatch, seq, mesh) traces one)"
                )
            return fn(*args, **kwargs)

        return checked

    return wrap
