"""MXFP8 GEMMs: block-scaled fp8 with current scaling (``quantization: mxfp8``; MaxText's
``te_mxfp8``), for Blackwell targets.

The format (OCP Microscaling Formats v1.0, as NVIDIA's Blackwell tensor cores and Transformer
Engine's ``MXFP8BlockScaling`` recipe run it): each GEMM operand is cut into blocks of
:data:`BLOCK` = 32 consecutive elements along that GEMM's contracting dimension; each block gets
one power-of-two scale stored as ``float8_e8m0fnu`` and its elements are ``float8_e4m3fn``
(``x ≈ q · 2^e``).  The scale is *current*: computed from the block's own values in the step that
uses it, no amax history and no state.  The block scale is the smallest power of two ``2^e`` with
``amax / 2^e ≤ 448`` (e4m3's largest finite value): ``e = ceil(log2(amax / 448))``, the rounding
up that never clips (NVIDIA's recipe, the one ``jax.nn.get_scaled_dot_general_config('mxfp8')``
quantizes with; the OCP text's ``floor(log2 amax) − 8`` can clip the block's largest element).  A
block of zeros gets the smallest scale, 2^-127.  Every tensor of the GEMM — the input, the kernel
and, in the backward pass, the output gradient — is e4m3 (Transformer Engine's MXFP8 recipe:
"E5M2 not supported"; JAX's mxfp8 config uses e4m3 for the gradient too).

Backward: each of the two backward GEMMs (``dx = g · wᵀ``, ``dw = xᵀ · g``) contracts over a
different dimension than the forward one, so its operands are quantized afresh along it (MXFP8's
blocks run along the contraction; a forward e4m3 copy blocked along K cannot be reused for dw).
The GEMM's residuals are therefore its two inputs in the compute dtype (as in JAX's
``scaled_dot_general``), not fp8 copies.

Where it runs.  On a CUDA lowering the block-scaled product is ``jax.nn.scaled_matmul`` (JAX's
``__op$block_scaled_dot``, which XLA:GPU rewrites for Blackwell into cuDNN's block-scaled GEMM,
``__cudnn$blockScaledDot``, seen in a deviceless B200 compile).  Everywhere else (XLA:CPU) the
same quantized operands and scales are dequantized and multiplied in float32: MXFP8's numerics
emulated, not fp8 GEMMs (the CLI says so on stderr).  The choice is made at lowering time
(``jax.lax.platform_dependent``), so the traced program (inventory, FLOPs) is one.

A contracting dimension that is not a multiple of 32 (a tiny model's, or a token count in ``dw``)
is padded with zeros to one: zeros change neither a block's amax nor the product (the traced
FLOPs then count the padded GEMM, as the GPU runs it).

Counting them in XLA's program as written: with the mesh sharded (fsdp) XLA peeled one iteration
of the backward layer loop out of it (its trip count is one less than the layer count), so each
backward block-scaled GEMM is written twice (the loop body's and the peeled copy's) while the
number executed equals the traced 2 per projection per layer (bench/results/fp8_compile.json).

JAX API used: ``jax.nn.scaled_matmul``, ``jax.lax.platform_dependent`` and
``jnp.float8_e8m0fnu`` (public; present in jax 0.10.2 here and in the older jax source the search
index holds; the GPU machine's jax 0.11.2 was not reachable to run them).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tierax.errors import TieraxError

BLOCK = 32  # elements per scale block (OCP MX v1.0; cuDNN's MXFP8 block-scaled GEMM)
ELEMENT = jnp.float8_e4m3fn  # every operand, forward and backward
SCALE = jnp.float8_e8m0fnu  # one power-of-two scale per block
E4M3_MAX = float(jnp.finfo(ELEMENT).max)  # 448
# e8m0's exponent bias; the scale 2^-127 stands in for a block of zeros
E8M0_BIAS = 127


def block_exponents(amax):
    """The e8m0 exponent ``e`` (unbiased, int32) of blocks with largest magnitude ``amax``:
    the smallest with ``amax / 2^e ≤ 448``, clamped to e8m0's range [-127, 127]; -127 for 0."""
    ratio = amax.astype(jnp.float32) / E4M3_MAX
    # frexp: ratio = m · 2^k, m in [0.5, 1); ceil(log2 ratio) is k − 1 when m == 0.5 exactly, else k
    m, k = jnp.frexp(ratio)
    e = jnp.where(m == 0.5, k - 1, k)
    e = jnp.where(ratio > 0, e, -E8M0_BIAS)
    return jnp.clip(e, -E8M0_BIAS, E8M0_BIAS).astype(jnp.int32)


def _pad_last(x, multiple: int):
    extra = (-x.shape[-1]) % multiple
    if not extra:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def quantize(x):
    """Block-quantize ``x`` along its last dimension (padded with zeros to a multiple of
    :data:`BLOCK`): (``float8_e4m3fn`` values of ``x``'s padded shape, ``float8_e8m0fnu`` scales of
    shape ``[..., K / 32]``)."""
    x = _pad_last(x, BLOCK)
    blocks = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    e = block_exponents(jnp.max(jnp.abs(blocks), axis=-1))
    # x · 2^-e, not x / 2^e: 2^-127 is a float32 subnormal, which XLA:CPU flushes to zero (a zero
    # block would give 0/0); 2^127 is a normal number
    scaled = blocks * jnp.ldexp(jnp.float32(1), -e)[..., None]
    q = jnp.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(ELEMENT).reshape(x.shape)
    # e8m0 holds the biased exponent as its bit pattern
    scales = jax.lax.bitcast_convert_type((e + E8M0_BIAS).astype(jnp.uint8), SCALE)
    return q, scales


def dequantize(q, scales):
    """``q · 2^e`` in float32 (the emulated operand)."""
    e = jax.lax.bitcast_convert_type(scales, jnp.uint8).astype(jnp.int32) - E8M0_BIAS
    v = q.astype(jnp.float32).reshape(*scales.shape, BLOCK)
    return (v * jnp.ldexp(jnp.float32(1), e)[..., None]).reshape(q.shape)


def _emulated(qa, qb, sa, sb, out_dtype):
    a, b = dequantize(qa, sa), dequantize(qb, sb)
    out = jnp.einsum("bmk,bnk->bmn", a, b, precision=jax.lax.Precision.HIGHEST)
    return out.astype(out_dtype)


def _cuda(qa, qb, sa, sb, out_dtype):
    return jax.nn.scaled_matmul(qa, qb, sa, sb, preferred_element_type=out_dtype)


def block_scaled_matmul(a_BMK, b_BNK, out_dtype):
    """``einsum('bmk,bnk->bmn', a, b)`` with both operands MXFP8-quantized along K, accumulated in
    float32, returned in ``out_dtype``: cuDNN's block-scaled GEMM on a CUDA lowering, the
    dequantized float32 product elsewhere (emulated)."""
    qa, sa = quantize(a_BMK)
    qb, sb = quantize(b_BNK)
    dt = jnp.dtype(out_dtype)
    return jax.lax.platform_dependent(
        qa,
        qb,
        sa,
        sb,
        cuda=partial(_cuda, out_dtype=dt),
        default=partial(_emulated, out_dtype=dt),
    )


# The dot_general forms the models use (tierax.models.layers / moe): a projection contracting
# x's last dimension with the kernel's first, and the experts' batched form.
LINEAR = "linear"
EXPERTS = "experts"


def _to_bmk(x, form: str, role: str):
    """Lay out one GEMM operand as [B, M, K] with K the contraction."""
    if form == LINEAR:
        if role == "x":  # [..., K] → [1, M, K]
            return x.reshape(1, -1, x.shape[-1])
        return x.T[None]  # kernel [K, N] → [1, N, K]
    if role == "x":  # [E, C, D]
        return x
    return jnp.swapaxes(x, 1, 2)  # [E, D, F] → [E, F, D]


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def mxfp8_dot(x, w, form: str, compute_dtype: str):
    """The GEMM of ``form`` in MXFP8: :data:`LINEAR` (``x[..., K] @ w[K, N]``) or :data:`EXPERTS`
    (``einsum('ecd,edf->ecf', x, w)``); operands and product in ``compute_dtype``."""
    return _fwd(x, w, form, compute_dtype)[0]


def _fwd(x, w, form, compute_dtype):
    dt = jnp.dtype(compute_dtype)
    if x.dtype != dt or w.dtype != dt:
        raise TieraxError(
            f"mxfp8_dot: operands {x.dtype}, {w.dtype} must be in the compute dtype {dt}"
        )
    y = block_scaled_matmul(_to_bmk(x, form, "x"), _to_bmk(w, form, "w"), dt)
    if form == LINEAR:
        y = y.reshape(*x.shape[:-1], w.shape[-1])
    return y, (x, w)


def _bwd(form, compute_dtype, res, g):
    dt = jnp.dtype(compute_dtype)
    x, w = res
    if form == LINEAR:
        K, N = w.shape
        g_MN = g.reshape(-1, N)
        x_MK = x.reshape(-1, K)
        dx = block_scaled_matmul(g_MN[None], w[None], dt)[0].reshape(x.shape)  # over N
        dw = block_scaled_matmul(x_MK.T[None], g_MN.T[None], dt)[0]  # over the tokens M
        return dx, dw
    # experts: g [E, C, F], x [E, C, D], w [E, D, F]
    dx = block_scaled_matmul(g, w, dt)  # contract F: [E, C, F] × [E, D, F] → [E, C, D]
    dw = block_scaled_matmul(
        jnp.swapaxes(x, 1, 2), jnp.swapaxes(g, 1, 2), dt
    )  # contract C: [E, D, C] × [E, F, C] → [E, D, F]
    return dx, dw


mxfp8_dot.defvjp(_fwd, _bwd)


class Mxfp8Linear(nnx.Module):
    """A bias-free linear layer ``x @ kernel`` with its GEMM in MXFP8 (the kernel's master copy in
    ``param_dtype``, the product in ``dtype``; no state beside the kernel: current scaling)."""

    def __init__(self, in_dim, out_dim, *, dtype, param_dtype, kernel_init, rngs: nnx.Rngs):
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_dim, out_dim), param_dtype))
        self.dtype = dtype

    def __call__(self, x):
        dt = jnp.dtype(self.dtype)
        return mxfp8_dot(x.astype(dt), self.kernel[...].astype(dt), LINEAR, dt.name)


EXPERT_FORMS = ("ecd,edf->ecf", "ecf,efd->ecd")


def einsum(spec: str, x, w, compute_dtype):
    """An MXFP8 ``jnp.einsum`` for the expert GEMMs' batched forms :data:`EXPERT_FORMS`."""
    if spec not in EXPERT_FORMS:
        raise TieraxError(f"mxfp8 einsum: unsupported form {spec!r}; supported: {EXPERT_FORMS}")
    return mxfp8_dot(x, w, EXPERTS, jnp.dtype(compute_dtype).name)


def gemm_bytes_moved(m: int, n: int, k: int, itemsize: int) -> int:
    """HBM bytes of one MXFP8 GEMM's quantization (read each operand in the compute dtype, write
    its e4m3 copy and its scales: one byte per element plus one per 32) — the work the cost model
    prices as HBM time."""
    elems = m * k + n * k
    return int(elems * (itemsize + 1) + np.ceil(elems / BLOCK))
