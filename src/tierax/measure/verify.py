"""Gradient equivalence: a plan's loss and gradients against ``save-all``, on the local backend.

A plan only moves activations between device memory, host memory and
recomputation; it must not change the numbers.  :func:`verify_plan` compiles and
runs the plan's own program (:func:`compiled_step`: loss and gradients under the
plan's policies) and ``save-all``'s, on the same parameters and tokens, and compares
the loss and every gradient leaf.  Nothing is cached between calls.  The error of a leaf is
``max |g_plan − g_ref| / max |g_ref|`` (relative to the reference leaf's largest
magnitude, as ``tests/test_plan_battery.py`` measures it); a NaN or infinity anywhere
fails.

Tolerances follow the compute dtype (``cfg.dtype``): recomputation re-runs the same
ops, but XLA may fuse and round them differently, and bfloat16 keeps 8 mantissa
bits:

===========  =========
float32      1e-5
float16      1e-2
bfloat16     2e-2
===========  =========

On a GPU this is the check that catches a compiler that mis-addresses an offloaded
buffer (openxla/xla#46231: XLA returned silently wrong gradients for offloaded scan
residuals read with a reversed dynamic-slice offset).  On XLA:CPU offloading is a no-op,
so a CPU pass says nothing about the offload path itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.mesh import MeshShape
from tierax.models import ModelConfig, build_model
from tierax.sharding import rules as sh
from tierax.train import step as step_lib

TOLERANCES: dict[str, float] = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}
REFERENCE_PLAN = "save-all"
WORST_LEAVES = 3  # leaves named in a result (all failing leaves are listed separately)


@dataclass(frozen=True, repr=False)
class LeafError:
    """One gradient leaf's error: ``rel_err = max|Δ| / max|reference|``."""

    path: str
    rel_err: float
    abs_err: float

    def __repr__(self) -> str:  # read in messages, e.g. f"worst leaves: {result.worst_leaves}"
        return f"{self.path}: {self.rel_err:.2e}"

    def to_json(self) -> dict:
        return {"leaf": self.path, "rel_err": _num(self.rel_err), "abs_err": _num(self.abs_err)}


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of one plan's check against ``save-all``.

    Attributes:
      plan: the plan's name.
      max_rel_err: the largest relative error over the gradient leaves and the loss.
      worst_leaves: the leaves with the largest errors, worst first (pytree paths
        such as ``groups/decoder/attention/wq/kernel``).
      tolerance: the bound ``max_rel_err`` must not exceed (from :data:`TOLERANCES`).
      passed: every error finite and within ``tolerance``.
      failing_leaves: every leaf above the tolerance (paths).
    """

    plan: str
    max_rel_err: float
    worst_leaves: tuple[LeafError, ...]
    tolerance: float
    passed: bool
    model: str
    dtype: str
    microbatch: int
    seq: int
    seed: int
    loss: float
    reference_loss: float
    loss_rel_err: float
    num_leaves: int
    failing_leaves: tuple[str, ...]
    backend: str

    def to_json(self) -> dict:
        return {
            "plan": self.plan,
            "passed": self.passed,
            "max_rel_err": _num(self.max_rel_err),
            "tolerance": self.tolerance,
            "worst_leaves": [w.to_json() for w in self.worst_leaves],
            "failing_leaves": list(self.failing_leaves),
            "loss": _num(self.loss),
            "reference_loss": _num(self.reference_loss),
            "loss_rel_err": _num(self.loss_rel_err),
            "num_leaves": self.num_leaves,
            "reference_plan": REFERENCE_PLAN,
            "model": self.model,
            "dtype": self.dtype,
            "microbatch": self.microbatch,
            "seq": self.seq,
            "seed": self.seed,
            "backend": self.backend,
            "error_measure": "per leaf max|g − g_ref| / max|g_ref|; the loss relative to "
            "|loss_ref|",
        }


def _num(x: float):
    """JSON has no inf/nan: non-finite numbers are written as strings."""
    return x if math.isfinite(x) else str(x)


def tolerance_for(dtype: str) -> float:
    """The stated tolerance for a compute dtype."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        raise TieraxError(
            f"no verify tolerance for dtype {dtype!r}; known: {', '.join(TOLERANCES)}"
        ) from None


def leaf_path(path) -> str:
    """A pytree key path as ``a/b/c`` (the trailing ``.value`` of NNX variables dropped)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    if len(parts) > 1 and parts[-1] == "value" and hasattr(path[-1], "name"):
        parts.pop()
    return "/".join(parts)


# --- the check -------------------------------------------------------------------


@jax.jit
def _errors(grads, ref):
    """Per leaf (max|Δ|, max|ref|), in float32."""

    def one(a, b):
        a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
        return jnp.max(jnp.abs(a32 - b32)), jnp.max(jnp.abs(b32))

    return jax.tree.map(one, grads, ref)


def _rel(abs_err: float, scale: float) -> float:
    if not (math.isfinite(abs_err) and math.isfinite(scale)):
        return math.inf
    return abs_err / max(scale, float(jnp.finfo(jnp.float32).tiny))


def compare(
    plan_name: str,
    cfg: ModelConfig,
    loss,
    grads,
    ref_loss,
    ref_grads,
    *,
    microbatch: int,
    seq: int,
    seed: int,
) -> VerifyResult:
    """Compare one plan's (loss, grads) with the reference's; pure, no compilation of the model."""
    tol = tolerance_for(cfg.dtype)
    ref_paths = [leaf_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(ref_grads)[0]]
    got_paths = [leaf_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(grads)[0]]
    if got_paths != ref_paths:
        raise TieraxError(
            f"plan {plan_name!r}: gradient tree differs from the reference ({len(got_paths)} vs "
            f"{len(ref_paths)} leaves)"
        )
    flat = jax.device_get(
        jax.tree.leaves(_errors(grads, ref_grads))
    )  # (max|Δ|, max|ref|) per leaf, flattened
    leaf_errs = [
        LeafError(path, _rel(float(d), float(m)), float(d))
        for path, d, m in zip(ref_paths, flat[::2], flat[1::2], strict=False)
    ]
    loss, ref_loss = float(loss), float(ref_loss)
    loss_err = _rel(abs(loss - ref_loss), abs(ref_loss)) if math.isfinite(loss) else math.inf
    worst = sorted(leaf_errs, key=lambda e: -e.rel_err)
    max_err = max([loss_err] + [e.rel_err for e in leaf_errs])
    failing = tuple(e.path for e in worst if not e.rel_err <= tol)
    return VerifyResult(
        plan=plan_name,
        max_rel_err=max_err,
        worst_leaves=tuple(worst[:WORST_LEAVES]),
        tolerance=tol,
        passed=bool(max_err <= tol),
        model=cfg.name,
        dtype=cfg.dtype,
        microbatch=microbatch,
        seq=seq,
        seed=seed,
        loss=loss,
        reference_loss=ref_loss,
        loss_rel_err=loss_err,
        num_leaves=len(leaf_errs),
        failing_leaves=failing,
        backend=jax.default_backend(),
    )


def model_and_init(cfg: ModelConfig, seed: int = 0, mesh=None):
    """(graphdef, jitted ``init() -> params``): what ``step.init_params`` does, as a function a
    caller can call again for fresh parameters without tracing the model again (sharded on
    ``mesh`` if given)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build_model(cfg, seed=seed)))
    shardings = None if mesh is None else sh.param_shardings(abstract, mesh)
    return graphdef, jax.jit(
        lambda: nnx.split(build_model(cfg, seed=seed))[1], out_shardings=shardings
    )


def compiled_step(graphdef, plan: plan_lib.Plan, cfg: ModelConfig, params, tokens, mesh=None):
    """The plan's own program: ``value_and_grad`` of the loss under the plan's policies
    (:func:`tierax.plan.to_policies`), lowered and compiled for these arguments (on ``mesh``, a
    :class:`jax.sharding.Mesh` the arguments are sharded over, if given)."""
    loss = step_lib.make_loss_fn(graphdef, plan_lib.to_policies(plan, cfg), mesh)
    return jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()


def verify_plans(
    cfg: ModelConfig,
    plans: Sequence[plan_lib.Plan],
    *,
    microbatch: int,
    seq: int,
    seed: int = 0,
    mesh: MeshShape | None = None,
) -> list[VerifyResult]:
    """:func:`verify_plan` for several plans, sharing one reference computation.

    Every plan's own compiled program runs, even one whose placements equal the reference's.
    ``mesh``: run every program (save-all's too) sharded on the first ``mesh.size`` local devices,
    ``microbatch`` then being the global batch.
    """
    if microbatch < 1 or seq < 1:
        raise TieraxError(
            f"verify needs microbatch ≥ 1 and seq ≥ 1, got microbatch={microbatch}, seq={seq}"
        )
    plans = [plan_lib.load_plan(p, cfg) for p in plans]  # validates names against the model
    jmesh = None
    if mesh is not None:  # refused before anything is built or compiled
        mesh.check_model(cfg, where="--mesh")
        mesh.check_batch(microbatch, where="--microbatch (the global batch)")
        jmesh = mesh.make(jax.devices()[: mesh.size])
    ref_plan = plan_lib.preset(REFERENCE_PLAN, cfg)
    graphdef, init = model_and_init(cfg, seed, jmesh)
    params = init()
    tokens = step_lib.synthetic_batch(cfg, microbatch, seq, seed=seed + 1)
    if jmesh is not None:
        tokens = jax.device_put(tokens, sh.batch_sharding(jmesh))
    reference = compiled_step(graphdef, ref_plan, cfg, params, tokens, jmesh)
    ref_loss, ref_grads = reference(params, tokens)
    results = []
    for p in plans:
        loss, grads = compiled_step(graphdef, p, cfg, params, tokens, jmesh)(params, tokens)
        results.append(
            compare(
                p.name,
                cfg,
                loss,
                grads,
                ref_loss,
                ref_grads,
                microbatch=microbatch,
                seq=seq,
                seed=seed,
            )
        )
    return results


def verify_plan(
    cfg: ModelConfig,
    plan: plan_lib.Plan,
    *,
    microbatch: int,
    seq: int,
    seed: int = 0,
    mesh: MeshShape | None = None,
) -> VerifyResult:
    """Run one step (loss and gradients) under ``plan`` and under ``save-all`` and compare them.

    Args:
      cfg: the model.
      plan: a Plan (or a preset name / plan file path).
      microbatch: sequences in the batch (one local device).
      seq: sequence length.
      seed: parameter seed; the tokens use ``seed + 1``.
      mesh: run sharded on this mesh (``microbatch`` is then the global batch).

    Returns:
      A :class:`VerifyResult`; ``passed`` is False above the dtype's tolerance.

    Raises:
      TieraxError: a plan that does not fit the model, bad sizes.
    """
    return verify_plans(cfg, [plan], microbatch=microbatch, seq=seq, seed=seed, mesh=mesh)[0]
