"""Memory and time model of one training step on a target, per device.

Inputs: an :class:`~tierax.tracing.inventory.Inventory` (measured from abstract traces), a
Plan, the target's :class:`Rates` and a schedule.  The model is *linear in the
placements* — each activation contributes its own bytes, recompute FLOPs and
transfer time — so the planner can optimise it exactly with an integer program;
:func:`simulate` and the planner share :func:`item_terms` and :func:`fixed_terms`.

Memory (per device): parameters, gradients and AdamW moments (sharded as the
step shards them: fsdp × expert, and tensor where tensor-parallel); activations kept on device (the
scan carry of every layer, plus each ``device`` activation; a group with every activation on device
runs without remat and keeps everything a layer saves, named or not); staging buffers for transfers
(one layer's offloaded slices, two with XLA's pipelined transfers); one layer's transient workspace
(its full residual set while it is recomputed and back-propagated — on a TPU the residuals XLA:TPU
writes, less the names the plan keeps on device, which the backward reads from their saved stacks:
:mod:`tierax.costmodel.kept_reads` —, a MoE layer's dispatch-sized
backward buffers, under FSDP its gathered weights, and, with an untiled loss, the head's float32
gradient or the logits' gradient it comes from, kept until the reduce-scatter after the loop); XLA's
transposed copies of stacked weights whose FSDP dimension is not major (live through both loops);
the float32 logits. The peak is the larger of two moments: a layer's backward (the state with every
gradient, kept activations, staging, the transposed copies and one layer's workspace) and the loss
(parameters, optimizer state and the layer gradients, kept activations and staging, the transposed
copies, the head's float32 gradient, plus the float32 logits and their gradient in the compute
dtype, or, when the loss is tiled, one tile's gradient and, under FSDP, the head gathered in the
compute dtype).  GPU targets add the fixed buffers XLA:GPU always allocates (the cuBLAS workspace,
by compute capability and jaxlib release: :func:`xla_gpu_fixed_bytes`).  Each term is a buffer
seen at deviceless XLA:GPU peaks.

Time: executed matmul FLOPs (forward, 2× for backward, plus recomputation) at the target's
achievable matmul rate, plus the non-matmul work's HBM bytes (:mod:`tierax.tracing.hbm`: every
layer's forward, backward and recomputation, the loss, the AdamW update) at the HBM bandwidth, not
overlapped with the matmuls (one GPU stream runs a fusion and a GEMM one after the other); host
transfers at the link bandwidth each way, hidden under compute (matmuls and HBM-bound work) per
schedule — ``serial``: none; ``lhs``: up to half of the same layer's compute; ``lhs-pipelined``: up
to the whole neighbouring layer's compute — under XLA's offload policy; tierax's prefetching scan (a
plan's default mechanism) hides each copy under a whole layer unless the schedule is serial, and
stages one layer beyond the workspace (:func:`staging_and_window`); FSDP
all-gathers/reduce-scatters, data-parallel gradient all-reduces, MoE all-to-alls and tensor-parallel
all-reduces over their mesh axes,
each at its link (NVLink inside a domain, the scale-out network across domains:
:mod:`tierax.costmodel.network`), exposed under ``serial`` and hidden under compute otherwise; a
rematerialised layer repeats its forward's collectives (counted with its unnamed recomputation,
which every remat policy of that group pays).

Training state (a plan's ``state:``, :mod:`tierax.costmodel.state`): an offloaded group's moments
(and master weights, down to a compute-dtype copy) leave both peak phases and take host memory;
the update streams them through the device layer by layer after the backward, a third peak phase
(the state left on device plus two layers' slices), and its copies each way beyond the group's own
update time are exposed.
"""

from tierax.costmodel.fixed import FixedTerms, collective_s_by_group, fixed_terms
from tierax.costmodel.predict import (
    Breakdown,
    Prediction,
    evaluate,
    peak_rows,
    phase_text,
    plan_placements,
    simulate,
)
from tierax.costmodel.rates import (
    ACHIEVABLE_FRACTION,
    Rates,
    calibration_file,
    for_program,
    load_calibration,
    override_rates,
    target_rates,
    xla_gpu_fixed_bytes,
)
from tierax.costmodel.resources import RESOURCES, StepSplit, scale_rates
from tierax.costmodel.state import StateCost, StateTerms, state_terms
from tierax.costmodel.terms import (
    OVERLAP_WINDOW,
    SCHEDULES,
    STAGING_LAYERS,
    GroupTerms,
    ItemTerms,
    exposed_stores,
    forward_collective_s,
    group_terms,
    item_terms,
    staging_and_window,
)

__all__ = [
    "ACHIEVABLE_FRACTION",
    "OVERLAP_WINDOW",
    "RESOURCES",
    "SCHEDULES",
    "STAGING_LAYERS",
    "StateCost",
    "StateTerms",
    "StepSplit",
    "xla_gpu_fixed_bytes",
    "calibration_file",
    "FixedTerms",
    "GroupTerms",
    "ItemTerms",
    "Breakdown",
    "Prediction",
    "peak_rows",
    "phase_text",
    "Rates",
    "collective_s_by_group",
    "evaluate",
    "exposed_stores",
    "fixed_terms",
    "for_program",
    "forward_collective_s",
    "group_terms",
    "item_terms",
    "load_calibration",
    "override_rates",
    "plan_placements",
    "scale_rates",
    "simulate",
    "staging_and_window",
    "state_terms",
    "target_rates",
]
