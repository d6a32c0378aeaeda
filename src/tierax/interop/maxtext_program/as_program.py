"""MaxText's own program as the :class:`~tierax.tracing.program.Program` the cost model prices, and
MaxText's ``remat_policy`` as the tierax Plan it runs.

Every figure is MaxText's: its config loaded by its loader (:mod:`.config`), its layer stacks and
train state traced (:mod:`.trace`), its remat policy read from its decoder
(``get_remat_policy()``), its model FLOPs from MaxText's
``maxtext_utils.calculate_tflops_training_per_device``.

* **Layer groups**: MaxText's stack names (``layers``; DeepSeek's ``dense_layers`` /
  ``moe_layers``; blocks), their activations MaxText's ``checkpoint_name`` tags.
* **dtypes**: ``dtype`` (compute) and ``weight_dtype`` (parameters); **hidden**: ``emb_dim``.
* **Head**: ``Head(emb_dim, vocab_size, num_vocab_tiling)``.  With ``logits_via_embedding`` the head
  is the embedding read transposed: the same ``[emb, vocab]`` matmuls and gradient, no weight of its
  own (the train state, traced, holds one table).
* **Attention**: the kernel the target runs, traced where MaxText traces it on a CPU.  MaxText on a
  CPU runs ``dot_product`` attention, which holds ``batch × heads × seq × seq`` score matrices no
  TPU or GPU run holds; so the layer is traced with the fused kernel instead:

  - GPU targets: the attention the user names (``cudnn_flash_jax`` unless given, as ``compile
    --maxtext`` compiles; ``cudnn_flash_te`` needs Transformer Engine to trace), traced as it runs;
    a cuDNN kernel's backward workspace, which a deviceless compile counts as 0, is the program's
    :class:`~tierax.tracing.program.FusedAttention` (heads per device = query heads ÷ tensor, q/k
    head dim: ``head_dim``, MLA: no-RoPE + RoPE dims);
  - TPU targets: MaxText runs its splash-attention Pallas kernel (``autoselected``/``flash``), a
    Mosaic custom call that MaxText cannot trace on a CPU mesh (its kernel choice reads the mesh's
    platform).  Its residuals are q, k, v, the output and the log-sum-exp, its backward writes dq,
    dk, dv and keeps its blocks in the core's VMEM: XLA:TPU's compile holds no score matrix and no
    workspace beyond those HBM buffers.  The layer is traced with ``attention=flash`` and MaxText's
    kernel call replaced by :func:`.attention_standin.splash_stand_in` (the same inputs, outputs
    and residuals, any head dims, MLA's smaller value head dim, attention sinks), and no
    FusedAttention workspace is added.  The kernel is opaque: the time model prices the
    attention's matmuls as 0 (memory is what this front end is checked on:
    ``bench/maxtext_fidelity.py``).
  - ``attention=dot_product`` given: traced and priced as it is (its scores included).

* **MoE backward buffers**: per MoE group, the dispatch-sized buffers its backward holds besides its
  residuals (:func:`moe_backward_bytes`); on a GPU also the gathered expert weights padded to the
  tiles of MaxText's interpreted expert kernel and two padded copies for its loops, the MoE groups'
  weight stacks copied to a layer-major layout (``stack_copy_params``) and a one-layer stack's
  gradients left out of the layers' backward (``late_grad_bytes``; :mod:`.weight_stacks`).
* **Model FLOPs**: MaxText's own per-device training TFLOPs (one microbatch: ÷
  ``gradient_accumulation_steps``).
* **The loss on a TPU** (``loss_bytes``, ``after_backward_bytes``, ``late_grad_bytes``:
  :mod:`.tpu_terms`): the head gathered in the compute dtype, the logits and the buffer written from
  them in it; the embedding's and head's gradients written after the layers' backward, the head's
  in the compute dtype and unsharded (reduced in place), a logits-sized buffer held through the
  layers' backward; a tiled loss: one ``[emb, vocab]`` in the compute dtype at a time; on v5e, a
  tied table gathered before the layers' forward loop where its gathers are collective matmuls,
  placed above the forward's buffers — read from XLA:TPU's (libtpu 0.0.52) buffer assignment and
  live ranges of MaxText's compiles (``bench/maxtext_fidelity.py --dump-dir``).
* **Single-trip routed-expert stacks on a TPU** (:mod:`.tpu_moe`): where a MoE stack's scan runs
  once (GPT-OSS's block of two layers cut to two, a DeepSeek stack of one layer) XLA:TPU inlines
  it and keeps the forward's gathered experts through the loss into the backward (added to
  ``loss_bytes``; their shard copies not made, ``uncopied_stack_bytes``) and writes the stack's
  gradients after its layers' backward (added to ``late_grad_bytes``); under a policy that saves
  names its backward gathers one routed layer's experts at a time (``gathered_expert_bytes``).
* **A dense decoder that is one single-trip stack on a TPU** (:mod:`.tpu_single_trip`): where the
  cut model is one scanned layer or block (OLMo 3 at 4 layers, Gemma 3 below 6) XLA:TPU inlines
  the trip and merges the recomputation with the forward: the loss holds the trip's residuals (less
  the plan's kept names read in place) and the last layer's gathered weights (added to
  ``loss_bytes``).
* **Scanned blocks of several layers on a TPU** (:mod:`.tpu_blocks`): where XLA:TPU's backward
  of a block (OLMo 3, Gemma 3, GPT-OSS, Llama 4) gathers one of its layers' weights at a time
  (v6e: every compile read), a layer's workspace holds the block's largest layer's gathered
  weights (``gathered_weight_bytes``), not the whole block's.
* **Routed experts under expert parallelism**: each group's routed-expert parameters per layer
  (``expert_param_count_per_layer``) are read from MaxText's train state (its stacks naming the
  experts' dimension, :func:`.weight_stacks.expert_params_per_layer`), so a layer's workspace
  gathers its ``E / expert`` local experts, not every expert.
* **The loss on a GPU** (``loss_bytes``, ``after_backward_bytes``, ``late_grad_bytes`` and the
  dense groups' ``stack_copy_params``: :mod:`.loss_terms`): the head gathered in the compute dtype,
  the logits and their gradient in it; the head's gradient in the compute dtype, unsharded, after
  the layers' backward, the embedding's and head's float32 gradients not live during it; XLA:GPU's
  layer-first copies of the stacked weights.  A tiled loss keeps the cost model's reading.

MaxText's policies are ``jax.checkpoint`` policies over names: a name the policy saves is kept, one
it offloads is offloaded, every other value (named or not) is recomputed; ``full`` (and ``none``,
under scanned layers) saves nothing but the scan's carry.  :func:`policy_plan` asks MaxText's
policy about each traced name, so no policy is re-described here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tierax import hardware
from tierax import names as N
from tierax.errors import TieraxError
from tierax.hardware import tpu_tiling
from tierax.interop.maxtext_program import (
    loss_terms,
    tpu_blocks,
    tpu_moe,
    tpu_offload,
    tpu_single_trip,
    tpu_terms,
    weight_stacks,
)

# The attention MaxText's step runs on a GPU target where the user names none (what compile
# --maxtext compiles: tierax.xla.maxtext_step.DEVICELESS_GPU_ATTENTION).
GPU_ATTENTION = "cudnn_flash_jax"
CUDNN_KERNELS = ("cudnn_flash_jax", "cudnn_flash_te")
# The kernels a TPU run of these attention values executes: MaxText's splash attention.
TPU_SPLASH = ("autoselected", "flash")
# The attention a TPU layer is traced with: MaxText's flash, its splash kernel stood in for by
# tierax.interop.maxtext_program.attention_standin (module docstring).
TPU_STAND_IN = "flash"
# The largest q/k head dim JAX's cuDNN attention traces with a CPU backend (its compute-capability
# check then takes the device for a pre-Hopper GPU).
CUDNN_TRACE_HEAD_DIM = 128


@dataclass(frozen=True)
class MaxTextProgram:
    """A MaxText run as tierax prices it: the Program, MaxText's remat policy as a Plan, the
    gradient accumulation, and what was traced."""

    program: object  # tierax.tracing.program.Program
    plan: object  # tierax.plan.Plan: MaxText's remat_policy
    grad_accum: int
    remat_policy: str
    attention: str  # the attention MaxText runs on the target
    traced_attention: str  # the attention the layer was traced with
    mesh: dict
    notes: tuple[str, ...] = ()


def trace_attention(target: str, attention: str) -> tuple[str, str]:
    """(the attention the target runs, the attention to trace it with) for MaxText's ``attention``
    value on ``target``.

    Raises:
      TieraxError: ``autoselected``/``flash`` on a GPU (a kernel that checks the device while
        tracing; name one), or a kernel the target does not run.
    """
    kind = hardware.get_target(target).kind
    if kind == "gpu":
        if attention in ("autoselected", "flash"):
            raise TieraxError(
                f"attention={attention} on a GPU target is a kernel that checks the device while "
                f"tracing; name the one the run uses, e.g. attention={GPU_ATTENTION} (what "
                "compile --maxtext compiles when none is given)"
            )
        return attention, attention
    if kind == "tpu":
        if attention in TPU_SPLASH:
            return "flash", TPU_STAND_IN
        if attention in CUDNN_KERNELS:
            raise TieraxError(
                f"attention={attention} is a GPU kernel; a TPU target runs flash (splash "
                "attention) or dot_product: leave attention out"
            )
        return attention, attention
    raise TieraxError(f"--maxtext prices a TPU or GPU target; {target!r} is a {kind}")


def policy_plan(policy, remat_policy: str, groups):
    """MaxText's ``jax.checkpoint`` policy (None: save nothing) as a tierax Plan over ``groups``
    (:class:`~tierax.models.config.LayerGroup`): each name asked of the policy as its
    ``checkpoint_name`` primitive — saved: device, offloaded: offload, else remat; the layer input
    (the scan's carry) on device unless the policy offloads it; unnamed values recomputed."""
    from jax._src import ad_checkpoint
    from jax._src.interpreters import partial_eval as pe

    from tierax.plan import Plan

    def ask(name: str) -> str:
        if policy is None:
            return "remat"
        got = policy(ad_checkpoint.name_p, name=name)
        if isinstance(got, pe.Offloadable):
            return "offload"
        if got is True or got is pe.Saveable:
            return "device"
        return "remat"

    out = {}
    for g in groups:
        entry = {"default": "remat"}
        for name in g.activations:
            where = ask(name)
            if name == N.DECODER_LAYER_INPUT and where == "remat":
                where = "device"  # the carry: saved by the scan whatever the policy
            entry[name] = where
        out[g.name] = entry
    return Plan.from_dict(
        {
            "plan": f"maxtext:{remat_policy}",
            "description": f"MaxText's remat_policy {remat_policy}, read from its decoder's "
            "jax.checkpoint policy (named values saved/offloaded per the policy, every other value "
            "recomputed)",
            "mechanism": "policy",
            "groups": out,
        },
        source=f"remat_policy {remat_policy}",
    )


def moe_backward_bytes(config, tokens: int, expert: int) -> int:
    """Bytes of the dispatch-sized buffers a MaxText MoE layer's backward holds besides its
    residuals, per device (:func:`tierax.models.moe.backward_buffer_bytes`'s reading of the same
    buffers: the expert outputs' gradient and the expert inputs' gradient, two more under expert
    parallelism), ``[rows, emb_dim]`` in the compute dtype each: ``rows`` = tokens × experts per
    token for MaxText's dropless (``sparse_matmul``) dispatch, experts × capacity for its capacity
    dispatch."""
    import jax.numpy as jnp

    k = int(config.num_experts_per_tok)
    e = int(config.num_experts)
    if bool(config.sparse_matmul) or float(config.capacity_factor) <= 0:
        rows = tokens * k
    else:
        rows = e * int(tokens * k * float(config.capacity_factor) / e)
    buffers = 4 if expert > 1 else 2
    return int(buffers * rows * int(config.emb_dim) * jnp.dtype(config.dtype).itemsize)


def model_flops(config) -> float:
    """MaxText's own training FLOPs per device for one microbatch
    (``calculate_tflops_training_per_device``, which counts every accumulated microbatch)."""
    from maxtext.utils import maxtext_utils

    with contextlib.redirect_stdout(sys.stderr):
        total, _, _ = maxtext_utils.calculate_tflops_training_per_device(config, log=False)
    return float(total) * 1e12 / max(1, int(config.gradient_accumulation_steps))


def qk_head_dim(config) -> int:
    """The query/key head dim of MaxText's attention (MLA: its no-RoPE plus RoPE parts)."""
    if str(getattr(config, "attention_type", "")).lower().endswith("mla"):
        return int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)
    return int(config.head_dim)


def _mesh_of(config, devices: int | None) -> dict | None:
    """The run's mesh in tierax's axes with MaxText's ``-1`` filled in: an ``ici_*`` axis takes the
    devices the other axes leave of ``devices``, a ``dcn_*`` axis one slice; None where no ``ici``
    axis is -1."""
    from tierax.interop.maxtext_program.config import TIERAX_AXES

    sizes = {}
    fill = []
    for axis, ici, dcn in zip(
        config.mesh_axes, config.ici_parallelism, config.dcn_parallelism, strict=True
    ):
        # dcn -1: the rest of the slices, one here (tierax prices one slice)
        sizes[axis] = sizes.get(axis, 1) * (1 if int(dcn) == -1 else int(dcn))
        if int(ici) == -1:
            fill.append((axis, "ici"))
        else:
            sizes[axis] *= int(ici)
    if not fill:
        return None
    if devices is None:
        raise TieraxError(
            "MaxText's config leaves "
            + ", ".join(f"{p}_{a}_parallelism" for a, p in fill)
            + " at -1 (the rest of the devices): give --devices N (or --mesh)"
        )
    fixed = 1
    for v in sizes.values():
        fixed *= v
    if len(fill) > 1 or devices % fixed:
        raise TieraxError(
            f"cannot fill MaxText's -1 parallelism ({', '.join(f'{p}_{a}' for a, p in fill)}) "
            f"from {devices} devices over the other axes' {fixed}; give --mesh"
        )
    axis = fill[0][0]
    sizes[axis] = sizes.get(axis, 1) * devices // fixed
    other = [a for a, n in sizes.items() if a not in TIERAX_AXES and n > 1]
    if other:
        return None  # config.check_priceable names what is not priced
    return {a: sizes.get(a, 1) for a in TIERAX_AXES}


def program(
    path: str,
    overrides: Sequence[str] = (),
    *,
    target: str,
    devices: int | None = None,
    mesh: Mapping[str, int] | None = None,
    microbatch: int | None = None,
    seq: int | None = None,
    grad_accum: int | None = None,
) -> MaxTextProgram:
    """MaxText's program of ``path`` with ``overrides`` and tierax's flags on ``target``
    (``devices`` fills MaxText's ``-1`` parallelism where no ``mesh`` is given), per device, and its
    remat_policy as a Plan.  What MaxText prints goes to stderr.

    Raises:
      TieraxError: what :func:`.config.load` refuses, a target that is neither TPU nor GPU, an
        attention the target does not run, a layer MaxText cannot trace on a CPU.
    """
    from tierax.interop.maxtext_program.config import load, parse_overrides

    user = parse_overrides(overrides)
    kind = hardware.get_target(target).kind
    if kind not in ("tpu", "gpu"):
        raise TieraxError(f"--maxtext prices a TPU or GPU target; {target!r} is a {kind}")
    for key in ("hardware", "compile_topology", "internal_compile"):
        if key in user:
            raise TieraxError(
                f"{key}={user[key]} is given: --target {target} sets what MaxText runs on; the "
                f"layer is traced on this CPU (hardware=cpu); leave {key} out"
            )
    sizes = dict(microbatch=microbatch, seq=seq, grad_accum=grad_accum)
    with contextlib.redirect_stdout(sys.stderr):
        with load(path, overrides, mesh=mesh, **sizes) as first:
            attention = str(first.config.attention)
            fill = None if mesh is not None else _mesh_of(first.config, devices)
        if kind == "gpu" and "attention" not in user and attention == "autoselected":
            attention = GPU_ATTENTION
        runs, traced = trace_attention(target, attention)
        if traced == "cudnn_flash_jax" and qk_head_dim(first.config) > CUDNN_TRACE_HEAD_DIM:
            raise TieraxError(
                f"MaxText's attention here has q/k head dim {qk_head_dim(first.config)}: "
                f"{runs} is traced on this CPU through JAX's cuDNN attention, which traces head "
                f"dims up to {CUDNN_TRACE_HEAD_DIM} only (without a GPU JAX takes the target for a "
                "pre-Hopper one), and dot_product's score matrices are no TPU or GPU run's: this "
                "attention is not priced yet"
            )
        # the traced kernel replaces the user's attention key (or the config's)
        keys = [o for o in overrides if not o.strip().startswith("attention=")]
        keys.append(f"attention={traced}")
        with load(path, keys, mesh=mesh or fill, **sizes) as loaded:
            return _build(loaded, target, runs, traced)


def _build(loaded, target: str, runs: str, traced: str) -> MaxTextProgram:
    from tierax.interop.maxtext_program.trace import (
        _abstract_model,
        _one_device_mesh,
        program_inventory,
    )
    from tierax.models.config import LayerGroup
    from tierax.tracing.program import FusedAttention, Head, Program

    config = loaded.config
    # on a TPU a saved value's stack takes XLA:TPU's tiled bytes, on device and host (.tpu_tiling)
    on_tpu = hardware.get_target(target).kind == "tpu"
    inv = program_inventory(loaded, tpu_tiling.stacked_value_bytes if on_tpu else None)
    groups = tuple(
        LayerGroup(g.name, g.num_layers, tuple(a.name for a in g.activations)) for g in inv.groups
    )
    tensor = loaded.mesh["tensor"]
    attention = None
    if runs in CUDNN_KERNELS:
        heads = max(1, int(config.num_query_heads) // tensor)
        attention = FusedAttention("cudnn", heads, qk_head_dim(config))
    tokens = inv.microbatch * inv.seq
    moe = ()
    if int(getattr(config, "num_experts", 1) or 1) > 1:
        per = moe_backward_bytes(config, tokens, loaded.mesh["expert"])
        moe = tuple((g.name, per) for g in inv.groups if _is_moe(g))
    # XLA:GPU's copies of the routed-expert groups' weight stacks (.weight_stacks)
    moe_stacks = None
    if moe and hardware.get_target(target).kind == "gpu":
        moe_stacks = weight_stacks.gpu_terms(
            config, [name for name, _ in moe], dict(inv.group_param_counts)
        )
        moe = tuple((name, b + moe_stacks.gmm(name)) for name, b in moe)
    import jax.numpy as jnp

    model = _abstract_model(config, _one_device_mesh(config))
    decoder = model.decoder
    if not hasattr(decoder, "get_remat_policy"):
        raise TieraxError(
            f"MaxText's decoder ({type(decoder).__name__}) has no get_remat_policy: its remat "
            "policy cannot be read"
        )
    policy_name = str(config.remat_policy)
    plan = policy_plan(decoder.get_remat_policy(), policy_name, groups)
    loss, after, late, uncopied, gathered = (None, 0, 0, 0, ())
    # a scanned block's backward gathering one of its layers' weights at a time (.tpu_blocks)
    one_layer = tpu_blocks.gathered_weight_bytes(config, inv, target)
    if hardware.get_target(target).kind == "tpu":
        tpu = tpu_terms.tpu_terms(config, inv, target, _offloads(plan))
        loss, after, late = tpu.loss_bytes, tpu.after_backward_bytes, tpu.late_grad_bytes
        # single-trip routed-expert stacks: gathered experts kept through the loss (.tpu_moe)
        kept = tpu_moe.tpu_moe_terms(config, inv, [n for n, _ in moe], _saves_nothing(plan))
        loss += kept.kept_gather_bytes
        late += kept.late_grad_bytes
        uncopied = kept.uncopied_stack_bytes
        gathered = kept.gathered_expert_bytes
        # a dense decoder that is one single-trip stack: the trip's residuals and its last
        # layer's gathered weights held at the loss (.tpu_single_trip)
        loss += tpu_single_trip.loss_bytes(
            config, inv, _placements(plan, inv.groups[0].name), [n for n, _ in moe]
        )
    # MaxText's loss on a GPU (None where not traced: the cost model's reading of tierax's loss)
    gpu = None
    if hardware.get_target(target).kind == "gpu":
        gpu = loss_terms.gpu_terms(config, inv, moe_groups=[name for name, _ in moe])
    if gpu is not None:
        loss, after, late = gpu.loss_bytes, gpu.after_backward_bytes, gpu.late_grad_bytes
        # one-layer routed-expert stacks' gradients: written after the layer's peak (.weight_stacks)
        late += moe_stacks.late_grad_bytes if moe_stacks else 0
    prog = Program(
        inventory=inv,
        groups=groups,
        dtype=jnp.dtype(config.dtype).name,
        param_dtype=jnp.dtype(config.weight_dtype).name,
        hidden=int(config.emb_dim),
        model_flops=model_flops(config),
        head=Head(int(config.emb_dim), int(config.vocab_size), int(config.num_vocab_tiling)),
        attention=attention,
        moe_backward_bytes=moe,
        loss_bytes=loss,
        after_backward_bytes=after,
        late_grad_bytes=late,
        uncopied_stack_bytes=uncopied,
        gathered_expert_bytes=gathered,
        gathered_weight_bytes=one_layer,
        stack_copy_params=(gpu.stack_copy_params if gpu else 0.0)
        + (moe_stacks.copy_params if moe_stacks else 0.0),
        # an unrolled or inlined layer scan's host buffers under offload (.tpu_offload)
        host_layout=tpu_offload.host_layout(groups, target),
    )
    notes = []
    if runs in TPU_SPLASH:
        notes.append(
            f"attention: MaxText runs {runs} (splash attention) on {target}; the layer was traced "
            "with a stand-in for its kernel with the same inputs, outputs and residuals (q, k, v, "
            "output, log-sum-exp; no score matrices); its matmul FLOPs are not in the time model"
        )
    # a 2-layer stack under host offload: XLA:TPU unrolls it; a 1-trip stack: it inlines it
    # (.tpu_offload; the device side not priced)
    from tierax.plan import resolve

    placements = resolve(plan, prog)
    for note in (
        tpu_offload.unrolled_note(placements, groups, target),
        tpu_offload.single_trip_note(placements, groups, target),
    ):
        if note:
            notes.append(note)
    return MaxTextProgram(
        program=prog,
        plan=plan,
        grad_accum=int(config.gradient_accumulation_steps),
        remat_policy=policy_name,
        attention=runs,
        traced_attention=traced,
        mesh=dict(loaded.mesh),
        notes=tuple(notes),
    )


def _placements(plan, group: str) -> dict[str, str]:
    """``group``'s names in MaxText's policy as a Plan (:func:`policy_plan`) and where it puts
    them (``"device"``, ``"offload"``, ``"remat"``)."""
    entry = plan.groups.get(group)
    return {} if entry is None else {n: w.value for n, w in entry.placements.items()}


def _offloads(plan) -> bool:
    """Whether MaxText's policy as a Plan (:func:`policy_plan`) offloads any name to the host."""
    return any(
        where.value == "offload"
        for group in plan.groups.values()
        for where in group.placements.values()
    )


def _saves_nothing(plan) -> bool:
    """Whether MaxText's policy as a Plan (:func:`policy_plan`) saves or offloads no name but the
    scan's carry (``full``: every layer recomputed)."""
    return all(
        where.value == "remat"
        for group in plan.groups.values()
        for name, where in group.placements.items()
        if name != N.DECODER_LAYER_INPUT
    )


def _is_moe(group) -> bool:
    """Whether a traced group's layers route tokens to experts (MaxText's MoE names)."""
    return any(a.name.startswith("moe_") for a in group.activations) or "moe" in group.name
