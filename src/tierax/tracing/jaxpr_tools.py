"""Reading a traced jaxpr: matmul FLOPs and the checkpoint-named activations.

Both walk nested jaxprs (scan, remat, pjit, custom_vjp ...) and multiply by the
trip count of every enclosing ``scan``.  They work on any JAX function, not only
on tierax's models.  Of a ``jax.lax.platform_dependent`` choice (a ``cond`` on
``platform_index``) they read the branch a CUDA lowering keeps (:data:`TRACED_PLATFORM`), as
XLA:GPU's program holds only that one: MXFP8's block-scaled GEMM (tierax.models.mxfp8), not the
emulation a CPU lowering runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from jax.extend.core import Literal, jaxprs_in_params

GROUP_SCOPE_PREFIX = "tierax_group_"
# The platform whose branch of a platform_dependent choice is read (the GPU program).
TRACED_PLATFORM = "cuda"


def scan_split(params) -> tuple[int, int]:
    """(constants, carries) among a ``scan`` equation's inputs, in that order before its scanned
    inputs: jax ≤ 0.11 states them as ``num_consts``/``num_carry``, jax 0.12 as the flat tree
    ``ft_in`` of (constants, carries, scanned inputs), where a carry the body passes through
    unchanged is already moved among the constants."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def platform_indices(jaxpr) -> dict:
    """The ``platform_index`` results of ``jaxpr``'s equations → their platforms."""
    return {
        e.outvars[0]: e.params["platforms"]
        for e in jaxpr.eqns
        if e.primitive.name == "platform_index"
    }


def platform_branch(eqn, platforms: dict) -> int | None:
    """For a ``cond`` whose index is a ``platform_index`` in ``platforms``: the branch a
    :data:`TRACED_PLATFORM` lowering keeps (that platform's, else the default); None otherwise."""
    if eqn.primitive.name != "cond" or not eqn.invars or isinstance(eqn.invars[0], Literal):
        return None
    choices = platforms.get(eqn.invars[0])
    if choices is None:
        return None
    for i, names in enumerate(choices):
        if names is not None and TRACED_PLATFORM in names:
            return i
    return next((i for i, names in enumerate(choices) if names is None), None)


def _walk(
    jaxpr, mult: int, scope: tuple[str, ...]
) -> Iterator[tuple[object, int, tuple[str, ...]]]:
    platforms = platform_indices(jaxpr)
    for eqn in jaxpr.eqns:
        stack = str(eqn.source_info.name_stack)
        here = scope + ((stack,) if stack else ())
        yield eqn, mult, here
        inner = mult * int(eqn.params["length"]) if eqn.primitive.name == "scan" else mult
        branch = platform_branch(eqn, platforms)
        subs = (
            [eqn.params["branches"][branch]] if branch is not None else jaxprs_in_params(eqn.params)
        )
        for sub in subs:
            yield from _walk(sub, inner, here)


def _jaxpr(closed_or_open):
    return getattr(closed_or_open, "jaxpr", closed_or_open)


def dot_general_flops(eqn) -> int:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs_shape = eqn.invars[0].aval.shape
    out_size = math.prod(eqn.outvars[0].aval.shape)
    contract = math.prod(lhs_shape[d] for d in lhs_contract)
    return 2 * out_size * contract


RAGGED_DOTS = ("ragged_dot", "ragged_dot_general")
# MXFP8's block-scaled GEMM, jax.nn.scaled_matmul: lhs [B, M, K] and rhs [B, N, K], both fp8, with
# their block scales (tierax.models.mxfp8)
BLOCK_SCALED_DOTS = ("scaled_matmul_wrapper", "scaled_matmul")


def block_scaled_flops(eqn) -> int:
    """2·B·M·N·K of a block-scaled GEMM (the scales' multiplications are not counted)."""
    b, m, k = eqn.invars[0].aval.shape
    return 2 * b * m * eqn.invars[1].aval.shape[1] * k


def ragged_dot_flops(eqn) -> int:
    """A grouped matmul's FLOPs, lhs [M, K] by one of the groups' [K, N] per row: 2·M·K·N (each
    row meets one group's weights, however the rows split into groups)."""
    lhs_shape = eqn.invars[0].aval.shape
    return 2 * math.prod(eqn.outvars[0].aval.shape) * lhs_shape[-1]


def _eqn_matmul_flops(eqn) -> int:
    """2·M·N·K of one matmul equation (a ``dot_general``, a grouped or a block-scaled matmul); 0
    for any other."""
    prim = eqn.primitive.name
    if prim == "dot_general":
        return dot_general_flops(eqn)
    if prim in RAGGED_DOTS:
        return ragged_dot_flops(eqn)
    if prim in BLOCK_SCALED_DOTS:
        return block_scaled_flops(eqn)
    return 0


def matmul_flops(closed_jaxpr, *, scope: str | None = None) -> int:
    """2·M·N·K summed over every ``dot_general`` and grouped matmul (``ragged_dot``) executed
    (scan trip counts included); with ``scope``, only those under a name scope containing it."""
    total = 0
    for eqn, mult, here in _walk(_jaxpr(closed_jaxpr), 1, ()):
        if scope is None or any(scope in s for s in here):
            total += mult * _eqn_matmul_flops(eqn)
    return total


def flops_before_names(
    closed_jaxpr, *, scope: str
) -> dict[str, tuple[float, float, float, float]]:
    """Per checkpoint name, the matmul FLOPs executed, in the trace's order (a layer's forward),
    before its first value is tagged and before the work that writes it begins, each as (all, of
    them those under a name scope containing ``scope``): ``(after, after_in_scope, before,
    before_in_scope)``.  The work that writes a value: the matmul it comes from, through any
    one-input steps after it (a cast, a reshape), else the step that makes it."""
    out: dict[str, tuple[float, float, float, float]] = {}
    total = in_scope = 0.0
    made: dict = {}  # var → (total, in_scope) before the work that writes it
    for eqn, mult, here in _walk(_jaxpr(closed_jaxpr), 1, ()):
        if eqn.primitive.name == "name":
            v = eqn.invars[0]
            at = made.get(v, (total, in_scope)) if not hasattr(v, "val") else (total, in_scope)
            out.setdefault(eqn.params["name"], (total, in_scope, *at))
            for o in eqn.outvars:
                made[o] = at
            continue
        flops = mult * _eqn_matmul_flops(eqn)
        ins = [v for v in eqn.invars if not hasattr(v, "val")]
        at = made.get(ins[0], (total, in_scope)) if not flops and len(ins) == 1 else None
        for o in eqn.outvars:
            made[o] = at or (total, in_scope)
        total += flops
        if flops and any(scope in s for s in here):
            in_scope += flops
    return out


def gemm_min_dim(eqn) -> int | None:
    """The smallest of a matmul equation's M, K and N (per batch element; a grouped matmul's M is
    its rows per group on average): how often each element it loads is reused, what a CPU GEMM's
    throughput follows (:meth:`tierax.costmodel.Rates.matmul_rate_at`).  None: not a matmul.

    A matmul's backward GEMMs (dX = dY·Wᵀ, dW = Xᵀ·dY) have the same three dimensions, so the
    forward's smallest dimension is theirs too."""
    name = eqn.primitive.name
    if name == "dot_general":
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
        m = math.prod(d for i, d in enumerate(lhs) if i not in lc and i not in lb)
        n = math.prod(d for i, d in enumerate(rhs) if i not in rc and i not in rb)
        return min(m, math.prod(lhs[i] for i in lc), n)
    if name in RAGGED_DOTS:
        lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
        groups = rhs[0] if len(rhs) == 3 else 1
        rows = math.prod(lhs[:-1]) // max(1, groups)
        return max(1, min(rows, lhs[-1], eqn.outvars[0].aval.shape[-1]))
    if name in BLOCK_SCALED_DOTS:
        (_, m, k), n = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape[1]
        return min(m, k, n)
    return None


def matmul_flops_by_min_dim(closed_jaxpr, *, exclude_scope: str | None = None) -> dict[int, int]:
    """:func:`matmul_flops` split by each matmul's :func:`gemm_min_dim`: smallest dimension →
    FLOPs; with ``exclude_scope``, without the matmuls under a name scope containing it (a fused
    attention kernel's, which run at the kernel's own rate, not as GEMMs)."""
    out: dict[int, int] = {}
    for eqn, mult, here in _walk(_jaxpr(closed_jaxpr), 1, ()):
        if exclude_scope is not None and any(exclude_scope in s for s in here):
            continue
        name = eqn.primitive.name
        if name == "dot_general":
            flops = dot_general_flops(eqn)
        elif name in RAGGED_DOTS:
            flops = ragged_dot_flops(eqn)
        elif name in BLOCK_SCALED_DOTS:
            flops = block_scaled_flops(eqn)
        else:
            continue
        d = gemm_min_dim(eqn)
        out[d] = out.get(d, 0) + mult * flops
    return out


FP8_DTYPES = frozenset(
    {"float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e4m3fnuz", "float8_e5m2fnuz"}
)


def fp8_matmul_flops(closed_jaxpr) -> int:
    """:func:`matmul_flops` of the ``dot_general`` equations whose two operands are fp8 (the GEMMs
    of ``quantization: fp8``) and of the block-scaled GEMMs (``mxfp8``)."""
    total = 0
    for eqn, mult, _ in _walk(_jaxpr(closed_jaxpr), 1, ()):
        if eqn.primitive.name in BLOCK_SCALED_DOTS:
            total += mult * block_scaled_flops(eqn)
        elif eqn.primitive.name == "dot_general" and all(
            str(v.aval.dtype) in FP8_DTYPES for v in eqn.invars[:2]
        ):
            total += mult * dot_general_flops(eqn)
    return total


@dataclass(frozen=True)
class NamedValue:
    """One ``checkpoint_name`` occurrence in a trace."""

    name: str
    group: str  # tierax layer group, or the name scope / "<top>" outside one
    shape: tuple[int, ...]
    dtype: str
    nbytes: int  # per execution (one layer)
    count: int  # executions per step (product of enclosing scan lengths)


def named_values(closed_jaxpr) -> list[NamedValue]:
    """Every checkpoint-named value in the trace with its group and execution count."""
    out = []
    for eqn, mult, scope in _walk(_jaxpr(closed_jaxpr), 1, ()):
        if eqn.primitive.name != "name":
            continue
        group = "<top>"
        for s in scope:
            for part in s.split("/"):
                if part.startswith(GROUP_SCOPE_PREFIX):
                    group = part[len(GROUP_SCOPE_PREFIX) :]
        aval = eqn.outvars[0].aval
        nbytes = math.prod(aval.shape) * aval.dtype.itemsize
        out.append(
            NamedValue(eqn.params["name"], group, tuple(aval.shape), str(aval.dtype), nbytes, mult)
        )
    return out
