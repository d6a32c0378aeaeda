"""A training step as the cost model reads it (:class:`Program`): the traced inventory and every
other figure of the program the step model prices, each measured by a front end — none recomputed
from a model config below it.

Front ends build it: :mod:`tierax.tracing.model_program` for tierax's own models (from their
config and trace), :mod:`tierax.api` for a user's loss function (from its trace alone).  The cost
model (:mod:`tierax.costmodel`) and the planner (:mod:`tierax.solving.planner`) take a Program, the
target's rates and a schedule, and nothing else; a plan is resolved against the Program's layer
groups (:meth:`Program.layer_groups`, what :func:`tierax.plan.resolve` reads).

What a front end must fill (what a trace alone gives is enough; each optional part says what its
absence means):

* ``inventory``: the tagged activations per layer group with bytes and recompute FLOPs, the
  parameter / gradient / optimizer bytes per device, the collective bytes per mesh axis
  (:class:`tierax.tracing.inventory.Inventory`);
* ``groups``: the layer groups (names, layer counts, tagged names) a plan names;
* ``dtype`` / ``param_dtype``: the compute and parameter dtypes;
* ``hidden``: the width of a layer's input (the hidden states, ``d_model``);
* ``model_flops``: the step's model FLOPs per device (MaxText's training-FLOPs convention,
  :mod:`tierax.models.flops`: recomputation not counted);
* ``head``: the loss phase's language-model head (:class:`Head`); None: the program has no head
  the model prices (its loss holds only ``extra_bytes``);
* ``attention``: a fused attention kernel whose backward allocates a workspace XLA's deviceless
  compile does not count (:class:`FusedAttention`); None: none;
* ``moe_backward_bytes``: per layer group, the dispatch-sized buffers a routed-expert layer's
  backward holds besides its residuals and its gathered weights
  (:func:`tierax.models.moe.backward_buffer_bytes`; MaxText's on a GPU also a copy of a gathered
  expert weight, :mod:`tierax.interop.maxtext_program.weight_stacks`); only routed-expert groups
  are listed;
* ``stack_copy_params``: per device, the parameters of stacked weights XLA:GPU gathers through a
  transposed copy (:func:`tierax.sharding.gather_layout.transposed_params`; 0: not known);
* ``extra_bytes``: device bytes live through the whole step that the trace does not see (a user's
  own buffers, the Python API's ``extra_bytes``);
* ``loss_bytes``: where a front end knows its program's loss holds other buffers than tierax's
  step (MaxText's, :mod:`tierax.interop.maxtext_program.as_program`), the bytes at the loss beside
  the state (less the gradients not yet written) and the kept activations; None: the cost model's
  reading of tierax's loss;
* ``after_backward_bytes``: where a front end knows its program holds more after the layers'
  backward than during it (MaxText's on TPU: the head's gradient reduced after the loop), all the
  device bytes live then (state included); 0: no such phase;
* ``late_grad_bytes``: of the state's gradients, the bytes the program writes only after the
  layers' backward, less what the loss leaves held through it (MaxText's embedding and head
  gradients: on a GPU :mod:`tierax.interop.maxtext_program.loss_terms`, on a TPU net of a
  logits-sized buffer or the head gradient's shard, :mod:`tierax.interop.maxtext_program.tpu_terms`,
  so it can be negative): subtracted from the layer phase; 0: all gradients counted there, nothing
  else;
* ``uncopied_stack_bytes``: of the cost model's TPU stack copies (every stacked weight's shard in
  the compute dtype, :func:`tierax.costmodel.fixed._tpu_stack_copy_bytes`), the bytes the program
  does not hold (MaxText's single-trip routed-expert stacks, whose gathered experts it keeps
  instead: :mod:`tierax.interop.maxtext_program.tpu_moe`); 0: every copy held;
* ``gathered_expert_bytes``: per layer group, the routed experts' gathered bytes one layer's
  backward holds where a front end knows them to differ from the layer's own experts
  (:func:`tierax.costmodel.fixed._group_workspace`: ``E / expert`` local experts of every routed
  layer of the group's layer, in the compute dtype): MaxText's single-trip routed-expert stacks
  under a policy that saves names, whose straight-line backward gathers one routed layer's experts
  at a time (:mod:`tierax.interop.maxtext_program.tpu_moe`); a group not listed: the layer's own;
* ``gathered_weight_bytes``: per layer group, the other (dense) weights' gathered bytes one layer's
  backward holds under FSDP where a front end knows them to differ from the whole scanned layer's
  (:func:`tierax.costmodel.fixed._group_workspace`: every weight of the group's layer gathered, in
  the compute dtype): MaxText's scanned blocks of several layers on a TPU, whose backward gathers
  one layer's weights at a time (:mod:`tierax.interop.maxtext_program.tpu_blocks`); a group not
  listed: the layer's own;
* ``batch_shaped``: whether the inventory's microbatch × seq is the step's batch (False: a trace at
  the caller's own shapes).

Which fields grow with the microbatch (what a front end rebuilds at another microbatch): every
activation's bytes and FLOPs in the inventory, ``inventory.logits_bytes``, ``model_flops`` and
``moe_backward_bytes``, ``loss_bytes``, ``after_backward_bytes`` and a TPU ``late_grad_bytes``
(the MaxText front end retraces at each batch); the fused kernel's workspace is computed from
``inventory.microbatch``.
The state bytes, the head's shape, ``stack_copy_params``, ``uncopied_stack_bytes``,
``gathered_expert_bytes`` and ``gathered_weight_bytes`` do not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tierax import plan as plan_lib
from tierax.models.config import LayerGroup
from tierax.tracing.inventory import Inventory


@dataclass(frozen=True)
class Head:
    """The language-model head the loss reads its logits from: a ``[hidden, vocab]`` weight, the
    logits computed in ``tiles`` chunks of the tokens (more than one: the backward recomputes each
    tile's logits, a head forward).  The logits' own bytes (float32, one tile's) are the
    inventory's ``logits_bytes``."""

    hidden: int
    vocab: int
    tiles: int = 1

    @property
    def params(self) -> int:
        return self.hidden * self.vocab

    @property
    def tiled(self) -> bool:
        return self.tiles > 1


@dataclass(frozen=True)
class FusedAttention:
    """A fused attention kernel the step runs (``kind``): cuDNN's flash attention (``cudnn``),
    whose backward allocates a workspace per call
    (:func:`tierax.hardware.cudnn.backward_workspace_bytes`), or the splash kernel on a TPU
    (``splash``), which allocates none; with the heads one device computes and the query/key head
    dimension, by which the workspace is sized and the time model prices the kernel at the
    program's shape (:func:`tierax.costmodel.rates.for_program`)."""

    kind: str
    heads_per_device: int
    qk_head_dim: int


@dataclass(frozen=True)
class Program:
    """One training step's program per device, as the cost model prices it (module docstring)."""

    inventory: Inventory
    groups: tuple[LayerGroup, ...]
    dtype: str
    param_dtype: str
    hidden: int
    model_flops: float
    head: Head | None = None
    attention: FusedAttention | None = None
    moe_backward_bytes: tuple[tuple[str, int], ...] = ()
    stack_copy_params: float = 0.0
    extra_bytes: int = 0
    loss_bytes: int | None = None
    after_backward_bytes: int = 0
    late_grad_bytes: int = 0
    uncopied_stack_bytes: int = 0
    gathered_expert_bytes: tuple[tuple[str, int], ...] = ()
    gathered_weight_bytes: tuple[tuple[str, int], ...] = ()
    # Whether a layer group of one layer holds its offloaded values in host memory: False for
    # tierax's own step (XLA removes its single-trip layer loop and keeps the value on device around
    # its host copy: tierax.plan.one_layer_offloads); a front end that applies a plan by its own
    # code (MaxText's remat policy, a user's model through tierax.api) keeps True.
    one_layer_groups_offload: bool = True
    # Per layer group whose compiled program holds its offloaded values otherwise than in host
    # stacks of a slot a layer: (group, (stack slots, host buffers of its own, each of a layer's
    # largest value of a name)); MaxText's on a TPU (tierax.interop.maxtext_program.tpu_offload).
    host_layout: tuple[tuple[str, tuple[int, int]], ...] = ()
    # Whether the inventory's microbatch and seq are the step's batch shape (False: a user's loss
    # function traced at its own shapes, which the model names no microbatch for).
    batch_shaped: bool = True

    @property
    def name(self) -> str:
        return self.inventory.model

    @property
    def microbatch(self) -> int:
        return self.inventory.microbatch

    @property
    def seq(self) -> int:
        return self.inventory.seq

    @property
    def mesh(self) -> dict:
        return self.inventory.mesh

    @property
    def tokens(self) -> int:
        return self.inventory.microbatch * self.inventory.seq

    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The layer groups a plan is resolved against (:func:`tierax.plan.resolve`)."""
        return self.groups

    def moe_backward(self, group: str) -> int:
        """:attr:`moe_backward_bytes` of ``group`` (a segment ``group@A-B``: its group's)."""
        return dict(self.moe_backward_bytes).get(group.partition("@")[0], 0)

    def with_inventory(self, inventory: Inventory) -> Program:
        return dataclasses.replace(self, inventory=inventory)

    def for_plan(self, plan: plan_lib.Plan) -> Program:
        """The program as ``plan`` runs it: each group ``plan`` segments split into its segments
        (rows named ``group@A-B``, ``num_layers`` the segment's length), one scan each."""
        segments = plan_lib.segments_of(plan, self)
        if not segments:
            return self
        inv = self.inventory
        groups = []
        for g in inv.groups:
            for start, stop, name in segments.get(g.name, [(0, g.num_layers, g.name)]):
                n = stop - start
                acts = tuple(
                    dataclasses.replace(a, group=name, num_layers=n) for a in g.activations
                )
                groups.append(dataclasses.replace(g, name=name, num_layers=n, activations=acts))
        return self.with_inventory(dataclasses.replace(inv, groups=tuple(groups)))
