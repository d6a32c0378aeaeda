"""The splash attention kernel's calls in XLA:TPU's scheduled program, timed at the cost model's
rates: what the static overlap check (:func:`tierax.xla.hlo.host_transfers`) counts for a Pallas
call, whose FLOPs XLA's roofline cannot see.

JAX's splash attention lowers to ``tpu_custom_call`` instructions named after its kernels:
``splash_mha_fwd_residuals`` / ``splash_mha_fwd_no_residuals`` (the forward, with or without the
log-sum-exp the backward reads), ``splash_mha_dkv_no_residuals`` and ``splash_mha_dq_no_residuals``
(the backward's two kernels).  Their query operand is ``[batch, heads, seq, head dim]``.  FLOPs by
FlashAttention's convention, which the kernel-rate table's rates are measured in
(:data:`tierax.costmodel.rates.FUSED_BACKWARD_FLOPS_RATIO`): the forward ``4·B·H·S²·d``, halved for
the causal mask tierax's and MaxText's decoders use; the backward 2.5 × that, split between its two
kernels by the matmuls each runs (dK/dV: the scores, dV, dP and dK, 4; dQ: the scores, dP and dQ,
3).
"""

from __future__ import annotations

from tierax.costmodel.rates import FUSED_BACKWARD_FLOPS_RATIO, Rates, attention_at
from tierax.xla.hlo import Instruction, Module

PREFIX = "splash_mha_"
# The backward's FLOPs by kernel: the share of its matmuls each runs.
BACKWARD_SHARE = {"dkv": 4 / 7, "dq": 3 / 7}


def kind(ins: Instruction) -> str | None:
    """``fwd``, ``dkv`` or ``dq`` for a splash kernel's call; None for any other instruction."""
    if ins.opcode != "custom-call" or not ins.name.startswith(PREFIX):
        return None
    if 'custom_call_target="tpu_custom_call"' not in ins.attrs:
        return None
    part = ins.name[len(PREFIX) :].split("_", 1)[0]
    return part if part in ("fwd", "dkv", "dq") else None


def query_dims(module: Module, ins: Instruction) -> tuple[int, int, int, int] | None:
    """The call's query operand's ``(batch, heads, seq, head dim)``: its first four-dimensional
    operand; None where it has none."""
    for name in ins.operands:
        op = module.by_name.get(name)
        if op is not None and len(op.arrays) == 1 and len(op.arrays[0].dims) == 4:
            b, h, s, d = op.arrays[0].dims
            return b, h, s, d
    return None


def forward_flops(b: int, h: int, s: int, d: int) -> float:
    """A causal forward's FLOPs by FlashAttention's convention."""
    return 4.0 * b * h * s * s * d / 2


def seconds(rates: Rates, module: Module, ins: Instruction) -> float | None:
    """Seconds of a splash kernel's call at ``rates``' fused attention rates (by the call's own
    sequence and head dim where ``rates`` holds the kernel measured by shape); None for any other
    instruction, or a call whose query operand is not ``[B, H, S, d]``."""
    k = kind(ins)
    dims = query_dims(module, ins) if k else None
    if dims is None:
        return None
    b, h, s, d = dims
    if rates.fused_attention_table:
        fwd_rate, bwd_rate = attention_at(rates.fused_attention_table, s, d)
    else:
        fwd_rate = rates.fused_attention_fwd_flops_per_s
        bwd_rate = rates.fused_attention_bwd_flops_per_s
    if not fwd_rate or not bwd_rate:
        return None
    flops = forward_flops(b, h, s, d)
    if k == "fwd":
        return flops / fwd_rate
    return FUSED_BACKWARD_FLOPS_RATIO * flops * BACKWARD_SHARE[k] / bwd_rate


def kernel_seconds(rates: Rates):
    """:func:`seconds` at ``rates``, as :func:`tierax.xla.hlo.host_transfers`' ``kernel_s``."""
    return lambda module, ins: seconds(rates, module, ins)
