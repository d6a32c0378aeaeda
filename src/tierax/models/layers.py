"""Layers shared by the reference models (Flax NNX).

Every activation a plan can place is tagged with ``checkpoint_name`` here,
inside the layer body that the model wraps in ``jax.checkpoint``; names come
from :mod:`tierax.names`.  Tensor names carry their shapes
(B batch, S/T query/key positions, D model, H heads, K kv heads, G query heads
per kv head, E experts, C expert capacity, F hidden).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
from flax import nnx

from tierax import names as N
from tierax.mesh import BATCH_AXES, constrain
from tierax.models import fp8, mxfp8
from tierax.models import moe as moe_lib
from tierax.models.attention import causal_attention
from tierax.models.documents import DocumentMask
from tierax.models.tags import tag

# Parameters the layers cast to the compute dtype (``cfg.dtype``) before any use, by the last key
# of their tree path: every projection's ``kernel`` (``nnx.Linear``'s dtype promotion,
# ``Fp8Linear`` and ``Mxfp8Linear`` cast it first) and the routed experts' stacked weights
# (:func:`tierax.models.moe.routed_experts` casts them before its GEMMs).  Not cast: RMSNorm's
# ``scale`` (used in float32), the MoE ``router`` (routing runs in float32), fp8 delayed-scaling
# metas (``fp8_*``, float32) and the token embedding (looked up, then cast: a copy cast first would
# sum its gradient's repeated rows in the compute dtype).
CAST_BEFORE_USE = ("kernel", "wi_0", "wi_1", "wo")


def cast_before_use(path) -> bool:
    """Whether the model uses the parameter at ``path`` (a tree path into the model's state) only
    through a cast to the compute dtype, so that a copy already in that dtype gives the same
    forward values and, cast back, the same gradient (the cast's transpose is a cast): what may
    stand in for its float32 master in the forward and backward (:mod:`tierax.train.masters`)."""
    keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
    keys = [k for k in keys if k != "value"]  # an nnx Variable's own attribute
    return bool(keys) and keys[-1] in CAST_BEFORE_USE


def _init(stddev: float) -> nnx.Initializer:
    return nnx.initializers.truncated_normal(stddev=stddev)


def dense(in_dim: int, out_dim: int, cfg, rngs: nnx.Rngs, *, quantize: bool = True):
    """A bias-free projection; its GEMM in fp8 under ``quantization: fp8`` (MXFP8 under ``mxfp8``)
    unless ``quantize`` is False (the LM head)."""
    quantized = {"mxfp8": mxfp8.Mxfp8Linear, "fp8": fp8.Fp8Linear}.get(cfg.quantization)
    if quantize and quantized is not None:
        return quantized(
            in_dim,
            out_dim,
            dtype=jnp.dtype(cfg.dtype),
            param_dtype=jnp.dtype(cfg.param_dtype),
            kernel_init=_init(in_dim**-0.5),
            rngs=rngs,
        )
    return nnx.Linear(
        in_dim,
        out_dim,
        use_bias=False,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=_init(in_dim**-0.5),
        rngs=rngs,
    )


def _heads(x_BSHd, mesh):
    """Heads over ``tensor``, batch over the batch axes (column-parallel output)."""
    return constrain(x_BSHd, mesh, BATCH_AXES, None, "tensor", None)


def _replicated(x_BSD, mesh):
    """Batch over the batch axes, model dimension whole (a row-parallel output: all-reduced over
    tensor)."""
    return constrain(x_BSD, mesh, BATCH_AXES, None, None)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, cfg, *, rngs: nnx.Rngs):
        del rngs
        self.scale = nnx.Param(jnp.ones((dim,), jnp.dtype(cfg.param_dtype)))
        self.eps = cfg.norm_eps
        self.dtype = jnp.dtype(cfg.dtype)

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].astype(jnp.float32).reshape((1,) * (x.ndim - 1) + (-1,))
        return (y * scale).astype(self.dtype)


# The platform the model is being traced for, where the step knows it (:func:`traced_for`): the
# form :func:`rope` takes.
_TRACED_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tierax_traced_for", default=None
)


@contextlib.contextmanager
def traced_for(platform: str | None):
    """Trace the layers inside for ``platform`` (``tpu``, ``gpu``, ``cpu``; None: no platform
    known), where a layer's form depends on it (:func:`rope`).  The train step's loss traces its
    model inside it (tierax.train.step.make_loss_fn); other traces (the cost model's inventory) take
    the platform-free form."""
    token = _TRACED_FOR.set(platform)
    try:
        yield
    finally:
        _TRACED_FOR.reset(token)


def rope(x_BSHd, theta: float, positions_BS=None):
    """Rotary position embedding (rotate-half form) over the last axis.

    ``positions_BS``: each token's position (packed documents restart at 0); None: 0 … S − 1.
    The same values in either of two forms: traced for a TPU (:func:`traced_for`)
    :func:`_rope_by_permutation` (XLA:TPU lays the halves of the other form out as arrays of half
    the head dim, each padded to 128 lanes: the chip's timing of both,
    bench/investigations/rope_forms.py), otherwise :func:`_rope_by_halves`.
    """
    seq, dim = x_BSHd.shape[1], x_BSHd.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    if positions_BS is None:
        angles_Sd = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq[None, :]
        sin = jnp.sin(angles_Sd)[None, :, None, :]
        cos = jnp.cos(angles_Sd)[None, :, None, :]
    else:
        angles_BSd = positions_BS.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
        sin, cos = jnp.sin(angles_BSd)[:, :, None, :], jnp.cos(angles_BSd)[:, :, None, :]
    form = _rope_by_permutation if _TRACED_FOR.get() == "tpu" else _rope_by_halves
    return form(x_BSHd, sin, cos)


def _rope_by_halves(x, sin, cos):
    """``concat([x1·cos − x2·sin, x2·cos + x1·sin])`` of the halves ``x1, x2`` of ``x``'s last
    axis (float32, cast back); ``sin``, ``cos``: the angles, half the last axis wide."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _rope_by_permutation(x, sin, cos):
    """:func:`_rope_by_halves`' values with no array of half the last axis:
    ``x·cos' + (x @ R)·sin'``, where ``R`` is the signed permutation taking ``x`` to
    ``concat([−x2, x1])`` (one ±1 term per output, accumulated in float32: exact) and ``cos'``,
    ``sin'`` repeat the angles over both halves."""
    half = x.shape[-1] // 2
    eye, zero = jnp.eye(half, dtype=x.dtype), jnp.zeros((half, half), x.dtype)
    rotate = jnp.block([[zero, eye], [-eye, zero]])
    rotated = jnp.einsum("...d,de->...e", x, rotate, preferred_element_type=jnp.float32)
    cos, sin = jnp.concatenate([cos, cos], axis=-1), jnp.concatenate([sin, sin], axis=-1)
    return (x.astype(jnp.float32) * cos + rotated * sin).astype(x.dtype)


def _doc_fields(doc: DocumentMask | None, mesh):
    """(positions, segment ids) batch over the batch axes; None, None without."""
    if doc is None:
        return None, None
    return (
        constrain(doc.positions, mesh, BATCH_AXES, None),
        constrain(doc.segment_ids, mesh, BATCH_AXES, None),
    )


class GQAttention(nnx.Module):
    """Grouped-query attention with RoPE (Llama 3)."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h, k, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.wq = dense(d, h * hd, cfg, rngs)
        self.wk = dense(d, k * hd, cfg, rngs)
        self.wv = dense(d, k * hd, cfg, rngs)
        self.wo = dense(h * hd, d, cfg, rngs)

    def __call__(self, x_BSD, mesh=None, doc: DocumentMask | None = None):
        c = self.cfg
        B, S, _ = x_BSD.shape
        K, G, hd = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim
        pos, seg = _doc_fields(doc, mesh)
        # Megatron: q/k/v column-parallel (heads over tensor), out-projection row-parallel.
        q_BSHd = _heads(rope(self.wq(x_BSD).reshape(B, S, K * G, hd), c.rope_theta, pos), mesh)
        k_BSKd = _heads(rope(self.wk(x_BSD).reshape(B, S, K, hd), c.rope_theta, pos), mesh)
        v_BSKd = _heads(self.wv(x_BSD).reshape(B, S, K, hd), mesh)
        q_BSHd = tag(q_BSHd, N.QUERY_PROJ)
        k_BSKd = tag(k_BSKd, N.KEY_PROJ)
        v_BSKd = tag(v_BSKd, N.VALUE_PROJ)
        ctx = causal_attention(
            q_BSHd.reshape(B, S, K, G, hd),
            k_BSKd,
            v_BSKd,
            impl=c.attention,
            block=c.attention_block,
            segment_ids=seg,
            mesh=mesh,
        )
        ctx_BSF = constrain(ctx.reshape(B, S, K * G * hd), mesh, BATCH_AXES, None, "tensor")
        ctx_BSF = tag(ctx_BSF, N.ATTENTION_OUT)
        return tag(_replicated(self.wo(ctx_BSF), mesh), N.OUT_PROJ)


class MLAttention(nnx.Module):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv, decoupled RoPE key."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h = cfg.d_model, cfg.num_heads
        self.wq_a = dense(d, cfg.q_lora_rank, cfg, rngs)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg, rngs=rngs)
        self.wq_b = dense(cfg.q_lora_rank, h * cfg.qk_head_dim, cfg, rngs)
        self.wkv_a = dense(d, cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg, rngs)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg, rngs=rngs)
        self.wkv_b = dense(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg, rngs)
        self.wo = dense(h * cfg.v_head_dim, d, cfg, rngs)

    def __call__(self, x_BSD, mesh=None, doc: DocumentMask | None = None):
        c = self.cfg
        B, S, _ = x_BSD.shape
        H, nope, rp, vd = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        pos, seg = _doc_fields(doc, mesh)
        qa_BSR = tag(self.wq_a(x_BSD), N.QUERY_WA_PROJ)
        qa_BSR = tag(self.q_norm(qa_BSR), N.MLA_Q)
        q_BSHd = _heads(self.wq_b(qa_BSR).reshape(B, S, H, nope + rp), mesh)
        q_nope = q_BSHd[..., :nope]
        q_BSHd = jnp.concatenate([q_nope, rope(q_BSHd[..., nope:], c.rope_theta, pos)], axis=-1)
        q_BSHd = tag(q_BSHd, N.QUERY_PROJ)

        kva_BSR = tag(self.wkv_a(x_BSD), N.KV_WA_PROJ)
        latent_BSL = tag(self.kv_norm(kva_BSR[..., : c.kv_lora_rank]), N.MLA_KV)
        krope_BS1r = rope(kva_BSR[..., c.kv_lora_rank :][:, :, None, :], c.rope_theta, pos)
        kv_BSHf = _heads(self.wkv_b(latent_BSL).reshape(B, S, H, nope + vd), mesh)
        k_BSHd = jnp.concatenate(
            [kv_BSHf[..., :nope], jnp.broadcast_to(krope_BS1r, (B, S, H, rp))], axis=-1
        )
        k_BSHd = tag(k_BSHd, N.KEY_PROJ)
        v_BSHv = tag(kv_BSHf[..., nope:], N.VALUE_PROJ)

        ctx = causal_attention(
            q_BSHd[:, :, :, None, :],
            k_BSHd,
            v_BSHv,
            impl=c.attention,
            block=c.attention_block,
            segment_ids=seg,
            mesh=mesh,
        )
        ctx_BSF = constrain(ctx.reshape(B, S, H * vd), mesh, BATCH_AXES, None, "tensor")
        ctx_BSF = tag(ctx_BSF, N.ATTENTION_OUT)
        return tag(_replicated(self.wo(ctx_BSF), mesh), N.OUT_PROJ)


@jax.custom_vjp
def swiglu_gate(g, u):
    """``silu(g) · u``, SwiGLU's gate, with its gradients each materialised on their own.

    Differentiated by JAX, XLA:CPU fused the gate's backward (sigmoid, products) into the
    transpose that lays each gradient out for its weight-gradient dot: an elementwise pass
    reading five [tokens, hidden] operands in transposed order, 0.56 of a 4.3 s step at
    d_model 1024 (per-op profile, issue 15).  Behind a barrier each gradient is written once in
    its natural layout and the transpose is a plain copy.  Residuals are ``g`` and ``u`` only
    (the values plans name), the sigmoid is recomputed in the backward pass.
    """
    return jax.nn.silu(g) * u


def _gate_fwd(g, u):
    return swiglu_gate(g, u), (g, u)


def _gate_bwd(res, dy):
    g, u = res
    s = jax.nn.sigmoid(g)
    dg = dy * u * s * (1 + g * (1 - s))  # d silu(g)/dg = s + g·s·(1 − s)
    du = dy * g * s
    # One barrier each, not one for both: a joint barrier would keep both gradients live together.
    return jax.lax.optimization_barrier(dg), jax.lax.optimization_barrier(du)


swiglu_gate.defvjp(_gate_fwd, _gate_bwd)


class SwiGLU(nnx.Module):
    """Dense SwiGLU MLP; also the shared expert of an MoE layer."""

    def __init__(self, d_model: int, hidden: int, cfg, *, rngs: nnx.Rngs):
        self.wi_0 = dense(d_model, hidden, cfg, rngs)
        self.wi_1 = dense(d_model, hidden, cfg, rngs)
        self.wo = dense(hidden, d_model, cfg, rngs)

    def __call__(self, x_BSD, mesh=None):
        # Megatron: up-projections column-parallel (hidden over tensor), down-projection
        # row-parallel.
        g_BSF = tag(constrain(self.wi_0(x_BSD), mesh, BATCH_AXES, None, "tensor"), N.MLPWI_0)
        u_BSF = tag(constrain(self.wi_1(x_BSD), mesh, BATCH_AXES, None, "tensor"), N.MLPWI_1)
        return tag(_replicated(self.wo(swiglu_gate(g_BSF, u_BSF)), mesh), N.MLPWO)


class MoE(nnx.Module):
    """Routed experts (top-k, capacity-based dispatch) plus optional shared experts."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, E, F = cfg.d_model, cfg.num_experts, cfg.expert_mlp_dim
        pdt = jnp.dtype(cfg.param_dtype)
        self.router = nnx.Param(_init(d**-0.5)(rngs.params(), (d, E), pdt))
        self.wi_0 = nnx.Param(_init(d**-0.5)(rngs.params(), (E, d, F), pdt))
        self.wi_1 = nnx.Param(_init(d**-0.5)(rngs.params(), (E, d, F), pdt))
        self.wo = nnx.Param(_init(F**-0.5)(rngs.params(), (E, F, d), pdt))
        self.shared = (
            SwiGLU(d, cfg.num_shared_experts * F, cfg, rngs=rngs)
            if cfg.num_shared_experts
            else None
        )
        self.fp8 = cfg.quantization == "fp8"
        if self.fp8:  # one delayed-scaling state per expert GEMM (all experts share it)
            for w in ("wi_0", "wi_1", "wo"):
                fp8.attach(self, prefix=f"{fp8.PREFIX}{w}_")

    def __call__(self, x_BSD, mesh=None):
        gemms = None
        if self.fp8:
            gemms = {w: fp8.metas(self, f"{fp8.PREFIX}{w}_") for w in ("wi_0", "wi_1", "wo")}
        out_BSD = moe_lib.routed_experts(
            x_BSD,
            self.router[...],
            self.wi_0[...],
            self.wi_1[...],
            self.wo[...],
            self.cfg,
            mesh,
            fp8_metas=gemms,
            mxfp8=self.cfg.quantization == "mxfp8",
        )
        if self.shared is not None:
            out_BSD = out_BSD + self.shared(x_BSD, mesh)
        return out_BSD


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)); then + mlp(norm(.))."""

    def __init__(self, attention: nnx.Module, mlp: nnx.Module, cfg, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, cfg, rngs=rngs)
        self.attention = attention
        self.mlp_norm = RMSNorm(cfg.d_model, cfg, rngs=rngs)
        self.mlp = mlp

    def __call__(self, x_BSD, mesh=None, doc: DocumentMask | None = None):
        """``mesh``: the :class:`jax.sharding.Mesh` the step runs on (None: one device, no
        constraints); ``doc``: packed documents' segment ids and positions (None: one per row)."""
        x_BSD = tag(_replicated(x_BSD, mesh), N.DECODER_LAYER_INPUT)
        h_BSD = x_BSD + self.attention(self.attn_norm(x_BSD), mesh, doc)
        return h_BSD + self.mlp(self.mlp_norm(h_BSD), mesh)
