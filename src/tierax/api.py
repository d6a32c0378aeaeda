"""The Python API for your own model: inventory → plan → ``jax.checkpoint`` policy.

Three calls (also exported as ``tierax.inventory``, ``tierax.plan``)::

    inv = tierax.inventory(loss_fn, params, batch)       # abstract trace, nothing allocated
    planned = tierax.plan(inv, target="h200", budget=40 * 2**30)
    policy = planned.policy("decoder")                   # for jax.checkpoint / nn.remat
    pathlib.Path("plan.yaml").write_text(planned.plan.to_yaml())     # keep it; later:
    policy = tierax.api.policy("plan.yaml", inv, "decoder")          # checked against the trace

What your model must do (the same as tierax's own models): run its layers with a
``lax.scan`` (``nn.scan`` / ``nnx.scan`` are fine) whose body applies
``jax.checkpoint`` (``nn.remat``) to one layer ``layer(x, params) -> y`` of the carry
``x``, tag activations inside that layer with ``jax.ad_checkpoint.checkpoint_name``
(any names: your own such as ``"my_up"`` or ``"qk_norm"``, or tierax's/MaxText's
:mod:`tierax.names`; only ``default``, ``segments``, ``layers`` and ``unnamed`` are taken by
the plan format), and optionally put
the scan in ``jax.named_scope("tierax_group_<name>")`` to name the layer group
(else ``layers``, ``layers_1``, …).  The policy used while tracing does not matter.

:func:`inventory` finds every such scan in the trace of ``loss_fn(params, batch)``
and measures each layer with :func:`tierax.tracing.inventory.layer_inventory` (bytes per
name, recompute FLOPs).  Per device: give per-device shapes; ``mesh`` in
:func:`plan` only divides parameter, gradient and AdamW state bytes over
``fsdp × tensor``.

What the rest of the step holds is read from the trace of ``jax.value_and_grad(loss_fn)``
(:mod:`tierax.tracing.loss_phase`, with XLA:GPU's fusion assumed: :mod:`tierax.tracing.liveness`),
with no configuration:

* **the loss phase** (between the layers' forward and backward scans): your LM head (the matmul
  with a 2-D parameter ``[hidden, vocab]`` producing the logits the loss reduces; over token tiles
  where the loss scans over them), and the bytes live at its peak besides the parameters, the
  optimizer state and the kept activations — the logits and their gradient, the head's operands
  and gradient, a tile loop's working set — and the gradients not yet written there;
* **routed experts**: a layer parameter a batched (or grouped, ``ragged_dot``) matmul reads is an
  expert weight; such a layer's backward buffers besides its residuals are priced with it.

The model's FLOPs are the layers' and the head's matmuls (3× forward).  A fused attention kernel's
workspace is not priced (the trace names none); ``extra_bytes`` in :func:`plan` adds device memory
of your own the trace does not see (live through the whole step).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

from tierax import costmodel as cm
from tierax.errors import TieraxError
from tierax.launch import flags as launch_flags
from tierax.models.config import LayerGroup
from tierax.plan import Plan, load_plan, to_policies
from tierax.plan.types import RESERVED_KEYS
from tierax.solving import planner, planning
from tierax.tracing import inventory as inv_lib
from tierax.tracing import jaxpr_tools, loss_phase
from tierax.tracing.program import Program

# Before JAX starts (it starts on first use): a machine without a GPU driver or TPU runs the API on
# JAX's CPU platform rather than letting an installed CUDA plugin fail noisily at start-up.
launch_flags.cpu_without_accelerator()

# What a "no plan fits" message suggests from Python (the planner's default names CLI options).
API_REMEDIES = (
    "Give smaller per-device shapes to tierax.inventory, a larger budget=, or more "
    "devices (mesh={'fsdp': N})"
)


@dataclass(frozen=True)
class ModelInventory:
    """:func:`inventory`'s result: the traced program (:class:`~tierax.tracing.program.Program`:
    its layer groups, per-device inventory, dtypes and model FLOPs, read from the trace alone)."""

    program: Program

    @property
    def inventory(self) -> inv_lib.Inventory:
        return self.program.inventory

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        return {g.name: g.activations for g in self.program.groups}


@dataclass(frozen=True)
class Planned:
    """:func:`plan`'s result: the Plan, the predicted step, why each choice, and the policies."""

    plan: Plan
    program: Program
    result: planner.PlanResult = field(repr=False)

    @property
    def predicted(self) -> cm.Prediction:
        return self.result.predicted

    def policy(self, group: str | None = None) -> Callable:
        """The ``jax.checkpoint`` policy of ``group`` (the only one if None).

        Always a policy: a group the plan keeps wholly on device gets ``everything_saveable``.
        (``to_policies`` says None there, meaning "run without jax.checkpoint"; but this layer is
        already inside your ``jax.checkpoint``, where ``policy=None`` recomputes everything.)
        """
        return _policy(self.plan, self.program, group)

    def placements(self) -> dict[str, dict[str, str]]:
        return {
            g: {n: p.value for n, p in gp.placements.items()} for g, gp in self.plan.groups.items()
        }


def _policy(plan: Plan, program: Program, group: str | None) -> Callable:
    """``group``'s ``jax.checkpoint`` policy under ``plan`` (validated against ``program``)."""
    names = [g.name for g in program.groups]
    if group is None:
        if len(names) != 1:
            raise TieraxError(
                f"the model has layer groups {', '.join(names)}; name one: policy(GROUP)"
            )
        group = names[0]
    if group not in names:
        raise TieraxError(f"no layer group {group!r}; the model's groups: {', '.join(names)}")
    segmented = [g for g, gp in plan.groups.items() if gp.segments]
    if segmented:
        raise TieraxError(
            f"plan {plan.name!r} splits group(s) {', '.join(segmented)} into segments, which run "
            "in tierax's segmented layer scan, not in your model's scan; remove 'segments'"
        )
    policies = to_policies(plan, program)
    policy = policies[group]
    if policy is not None and not callable(policy):  # tierax's prefetching scan (its models only)
        raise TieraxError(
            f"plan {plan.name!r} offloads with mechanism {plan.mechanism!r} (tierax's prefetching "
            "layer scan), which your model's scan does not run; add 'mechanism: policy' to the "
            "plan (XLA's host offloader under your jax.checkpoint)"
        )
    return jax.checkpoint_policies.everything_saveable if policy is None else policy


def policy(
    plan: str | os.PathLike | Plan, inventory: ModelInventory, group: str | None = None
) -> Callable:
    """The ``jax.checkpoint`` policy of ``group`` under a plan you keep (a :class:`Plan`, a plan
    YAML file such as ``tierax.plan(...).plan.to_yaml()`` writes, or a preset name), checked
    against the names ``inventory``'s trace found: a name the model does not tag is an error that
    lists the valid ones.

    Raises:
      TieraxError: the plan names a group or activation the trace lacks, has segments, or offloads
        with tierax's prefetching mechanism (your scan runs ``mechanism: policy``).
    """
    if not isinstance(inventory, ModelInventory):
        raise TieraxError(
            "policy() takes what tierax.inventory(loss_fn, params, batch) returns, "
            f"not a {type(inventory).__name__}"
        )
    if isinstance(plan, os.PathLike):
        plan = os.fspath(plan)
    if not isinstance(plan, (str, Plan)):
        raise TieraxError(
            f"plan is a {type(plan).__name__}; give a tierax Plan, a plan YAML path or a preset"
        )
    return _policy(load_plan(plan, inventory.program), inventory.program, group)


def _leaf_bytes(tree) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _check_params(params) -> None:
    """Parameters are what the gradient is taken of: at least one array, all floating point."""
    leaves = jax.tree_util.tree_leaves_with_path(_sds(params))
    if not leaves:
        raise TieraxError(
            "params holds no arrays; pass the parameter pytree that "
            "loss_fn(params, batch) differentiates"
        )
    bad = [
        f"{jax.tree_util.keystr(k)} ({v.dtype})"
        for k, v in leaves
        if not jnp.issubdtype(v.dtype, jnp.floating)
    ]
    if bad:
        more = " …" if len(bad) > 3 else ""
        raise TieraxError(
            f"params leaves {', '.join(bad[:3])}{more} are not floating point; "
            "gradients (and so a plan) need float parameters: cast them, or move "
            "constants into batch"
        )


def _bytes_arg(name: str, value, *, minimum: float, allow_none: bool = True) -> float | None:
    """A byte count given to :func:`plan`: None (its default) or a finite number ≥ ``minimum``."""
    if value is None and allow_none:
        return None
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= minimum
    )
    if not ok:
        raise TieraxError(
            f"{name}={value!r}: give a finite number of bytes ≥ {minimum:g}"
            + (" (or None for the default)" if allow_none else "")
        )
    return value


def _sds(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree)


def _layers(closed) -> list[tuple[str, int, object, list, object]]:
    """(group, length, remat eqn, scan body carries, scan eqn) of every scan over a rematted
    layer, outermost first."""
    out, seen = [], set()
    for eqn, _, scope in jaxpr_tools._walk(closed.jaxpr, 1, ()):
        if eqn.primitive.name != "scan" or id(eqn) in seen:
            continue
        body = eqn.params["jaxpr"].jaxpr
        remats = [e for e in body.eqns if e.primitive.name in ("remat2", "checkpoint")]
        consts, carries = jaxpr_tools.scan_split(eqn.params)
        carry = body.invars[consts : consts + carries]
        # A layer scan's checkpointed layer takes the carry; a loss computed over token tiles
        # checkpoints a function of its scanned inputs only (the loss phase's, not a layer).
        if len(remats) != 1 or not any(any(v is c for c in carry) for v in remats[0].invars):
            continue
        seen.add(id(eqn))
        group = next(
            (
                part[len(jaxpr_tools.GROUP_SCOPE_PREFIX) :]
                for s in scope
                for part in s.split("/")
                if part.startswith(jaxpr_tools.GROUP_SCOPE_PREFIX)
            ),
            None,
        )
        out.append((group, int(eqn.params["length"]), remats[0], carry, eqn))
    return out


def _layer_fn(remat, carry_vars) -> tuple[Callable, jax.ShapeDtypeStruct, tuple]:
    """The rematted layer as ``f(x, params) -> y``: x its one carry input, params its other
    inputs."""
    inner = remat.params["jaxpr"]
    carry_pos = [i for i, v in enumerate(remat.invars) if any(v is c for c in carry_vars)]
    if len(carry_pos) != 1:
        raise TieraxError(
            f"a scanned layer takes {len(carry_pos)} carry arrays into jax.checkpoint; "
            "tierax.inventory needs exactly one (the layer input x of layer(x, params)); use "
            "tierax.tracing.inventory.layer_inventory on the layer function instead"
        )
    xi = carry_pos[0]
    x_aval = remat.invars[xi].aval
    outs = [
        i
        for i, v in enumerate(inner.outvars)
        if v.aval.shape == x_aval.shape and v.aval.dtype == x_aval.dtype
    ]
    if not outs:
        raise TieraxError(
            "the rematted layer returns nothing shaped like its input; tierax.inventory needs "
            "layer(x, params) -> y with y shaped like x"
        )
    run = jaxpr_as_fun(ClosedJaxpr(inner, []))
    others = tuple(
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
        for i, v in enumerate(remat.invars)
        if i != xi
    )

    def layer(x, params):
        args = list(params)
        args.insert(xi, x)
        return run(*args)[outs[0]]

    return layer, jax.ShapeDtypeStruct(x_aval.shape, x_aval.dtype), others


def inventory(loss_fn: Callable, params, batch, *, name: str = "custom") -> ModelInventory:
    """The activation inventory of ``loss_fn(params, batch)`` (see the module docstring).

    Args:
      loss_fn: ``loss_fn(params, batch) -> scalar``; params/batch: arrays or
        ShapeDtypeStructs at per-device shapes (nothing is allocated).

    The program's head, loss-phase bytes and MoE backward buffers come from the trace of its
    gradient (the module docstring); ``inventory(...).program`` shows them.

    Raises:
      TieraxError: no scan over a ``jax.checkpoint``'ed layer with named activations, or a
        gradient whose forward does not run ``loss_fn``'s scans (its loss phase cannot be read).
    """
    if not callable(loss_fn):
        raise TieraxError(
            f"loss_fn is a {type(loss_fn).__name__}, not a function; pass "
            "loss_fn(params, batch) -> scalar loss"
        )
    _check_params(params)
    closed = jax.make_jaxpr(loss_fn)(_sds(params), _sds(batch))
    out = closed.out_avals
    if len(out) != 1 or out[0].shape != () or not jnp.issubdtype(out[0].dtype, jnp.floating):
        got = ", ".join(f"{a.dtype}{list(a.shape)}" for a in out)
        raise TieraxError(
            f"loss_fn returns {got or 'nothing'}; tierax plans the gradient of one "
            "floating-point scalar: return the mean loss (e.g. jnp.mean(...))"
        )
    groups, lgroups, used, dtypes, widths, moe_bytes = [], [], set(), [], [], []
    scans = _layers(closed)
    for k, (group, length, remat, carry, _) in enumerate(scans):
        layer, x, others = _layer_fn(remat, carry)
        dtypes.append(str(x.dtype))
        widths.append(int(x.shape[-1]) if x.shape else 1)
        gname = group or ("layers" if k == 0 else f"layers_{k}")
        if gname in used:
            raise TieraxError(
                f"two scans are named layer group {gname!r}; give each its own "
                "jax.named_scope('tierax_group_<name>')"
            )
        used.add(gname)
        experts = loss_phase.expert_params(layer, x, others)
        g = inv_lib.layer_inventory(
            layer, x, others, group=gname, num_layers=length, expert_param_count=experts
        )
        bad = [a.name for a in g.activations if a.name in RESERVED_KEYS]
        if bad:
            raise TieraxError(
                f"layer group {gname!r} tags {', '.join(map(repr, bad))}, which a plan uses as "
                f"its own key ({', '.join(RESERVED_KEYS)}); rename that checkpoint_name"
            )
        if g.activations:
            groups.append(g)
            lgroups.append(LayerGroup(gname, length, tuple(a.name for a in g.activations)))
            if experts:
                moe_bytes.append((gname, loss_phase.moe_backward(layer, x, others)))
    if not groups:
        raise TieraxError(
            "no scan over a jax.checkpoint'ed layer with checkpoint_name'd activations in loss_fn; "
            "see tierax.api's docstring (or examples/) for the form tierax plans"
        )
    hidden = widths[0]
    leaves = jax.tree.leaves(_sds(params))
    pdtype = str(leaves[0].dtype) if leaves else "float32"
    pbytes = _leaf_bytes(_sds(params))
    # The loss phase from the gradient's trace (tierax.tracing.loss_phase): its head, the bytes it
    # holds besides the state and the kept activations, the gradients not yet written there.
    loss = loss_phase.read(loss_fn, _sds(params), _sds(batch), closed, {id(s[-1]) for s in scans})
    inv = inv_lib.Inventory(
        model=name,
        microbatch=1,
        # the tokens the head computes logits for (the step's tokens as the trace gives them)
        seq=max(1, loss.head_tokens),
        mesh={"data": 1, "fsdp": 1},
        groups=tuple(groups),
        param_bytes=pbytes,
        grad_bytes=pbytes,
        optimizer_bytes=2 * pbytes,
        logits_bytes=loss.logits_bytes,
        # the parameters whose gradients are not yet written at the loss's peak (the cost model
        # counts the state there without them)
        embed_param_count=loss.unwritten_params,
    )
    head_flops = 2.0 * inv.seq * loss.head.params if loss.head else 0.0
    layer_flops = sum(g.forward_flops_per_layer * g.num_layers for g in groups)
    # What the trace gives of the rest of the program: the layers' and the head's matmuls (3× the
    # forward: the model FLOPs of MaxText's convention), the hidden width (the layer input's last
    # dimension), the loss phase and each routed-expert group's backward buffers.  No fused
    # attention kernel is priced: the trace names none.
    program = Program(
        inventory=inv,
        groups=tuple(lgroups),
        dtype=dtypes[0],
        param_dtype=pdtype,
        hidden=hidden,
        model_flops=3.0 * (layer_flops + head_flops),
        head=loss.head,
        moe_backward_bytes=tuple(moe_bytes),
        loss_bytes=loss.held_bytes,
        batch_shaped=False,
    )
    return ModelInventory(program)


def plan(
    inventory: ModelInventory,
    *,
    target: str = "h200",
    mesh: Mapping[str, int] | None = None,
    budget: float | None = None,
    host_budget: float | None = None,
    schedule: str = "lhs",
    extra_bytes: int = 0,
    name: str = "planned",
) -> Planned:
    """The fastest predicted plan for ``inventory`` on ``target`` within the budgets (bytes per
    device).

    Args:
      target: h100, h200, b200, gb200 (or cpu after ``tierax calibrate``).
      mesh: e.g. ``{"fsdp": 8}``: parameters, gradients and AdamW moments are split over fsdp ×
          tensor.  ``"auto"`` is refused: a custom loss function does not say what each axis
          shards (``tierax plan --mesh auto`` searches meshes for tierax's models).
      budget / host_budget: bytes per device (default: capacity minus 5 %, host memory per GPU).
      extra_bytes: device memory the trace does not see (buffers of your own, live through the
          whole step); the logits and the loss's buffers are read from the trace.

    Raises:
      TieraxError: unknown target or schedule, a budget above the device's usable memory, or no
        plan fits (the message says what would).
    """
    import dataclasses

    from tierax.mesh import MeshShape

    if not isinstance(inventory, ModelInventory):
        raise TieraxError(
            "plan() takes what tierax.inventory(loss_fn, params, batch) returns, "
            f"not a {type(inventory).__name__}"
        )
    if mesh == "auto":
        raise TieraxError(
            "mesh='auto' is not available for a custom loss function: choosing a mesh needs to "
            "know which weights and activations each axis shards (heads and MLP widths over "
            "tensor, experts over expert) and what each collective sends, which tierax reads from "
            "its own models' definitions, not from a traced loss_fn; give the mesh you run, e.g. "
            "mesh={'fsdp': 8}, or use `tierax plan --mesh auto` with a tierax model config"
        )
    budget = _bytes_arg("budget", budget, minimum=1)
    host_budget = _bytes_arg("host_budget", host_budget, minimum=0)
    extra_bytes = _bytes_arg("extra_bytes", extra_bytes, minimum=0, allow_none=False)
    inv = inventory.inventory
    program = inventory.program
    shard = 1
    if mesh:
        if not isinstance(mesh, Mapping):
            raise TieraxError(f"mesh={mesh!r}: give a mapping of axis sizes, e.g. {{'fsdp': 8}}")
        unknown = set(mesh) - {"data", "fsdp", "tensor", "expert"}
        if unknown:
            names = ", ".join(sorted(map(str, unknown)))
            raise TieraxError(f"mesh axes {names} unknown; use data, fsdp, tensor, expert")
        MeshShape(**mesh)  # each size an integer ≥ 1 (the message names the axis)
        shard = mesh.get("fsdp", 1) * mesh.get("tensor", 1)
        inv = dataclasses.replace(
            inv,
            mesh={"data": 1, "fsdp": 1, **dict(mesh)},
            param_bytes=inv.param_bytes // shard,
            grad_bytes=inv.grad_bytes // shard,
            optimizer_bytes=inv.optimizer_bytes // shard,
            # the cost model divides the unwritten gradients over fsdp × expert; these are split
            # as the gradients are, over fsdp × tensor
            embed_param_count=inv.embed_param_count
            * mesh.get("fsdp", 1)
            * mesh.get("expert", 1)
            // shard,
        )
    program = dataclasses.replace(
        program.with_inventory(inv), extra_bytes=program.extra_bytes + int(extra_bytes)
    )
    rates = cm.target_rates(target, program.dtype)
    planning.check_budget(budget, rates, option="budget=")
    planning.check_host_budget(host_budget, rates, option="host_budget=")
    # Your layer runs under jax.checkpoint with the policy this plan gives: XLA's offload policy
    # mechanism.
    result, _ = planning.solve(
        planning.Request(
            None,
            dict(inv.mesh),
            rates,
            schedule=schedule,
            budget_bytes=budget,
            host_budget_bytes=host_budget,
            name=name,
            mechanism="policy",
            remedies=API_REMEDIES,
            program=program,
            # Your training step, not tierax's, updates the optimizer state: the plan places
            # activations only (tierax.train.streamed is what runs offloaded moments).
            place_state=False,
        )
    )
    return Planned(result.plan, program, result)
