"""A stand-in for MaxText's TPU attention kernel, for tracing MaxText's layer for a TPU target on a
CPU.

On a TPU, MaxText's ``flash`` attention (and ``autoselected`` at training lengths) runs JAX's Pallas
splash-attention kernel (``jax.experimental.pallas.ops.tpu.splash_attention``), vmapped over the
batch.  MaxText picks its kernel from the mesh's platform, so on a CPU mesh it runs another one, and
the Mosaic kernel does not lower for a CPU anyway.  While :func:`standing_in` is active, MaxText's
``AttentionOp.apply_attention`` with ``attention=flash`` runs :func:`splash_stand_in` instead: the
data flow splash attention has in MaxText's program, with an opaque kernel.

* **Inputs and outputs** as MaxText's ``tpu_flash_attention``: q ``[B, S, Hq, Dqk]``, k
  ``[B, T, Hkv, Dqk]``, v ``[B, T, Hkv, Dv]`` (any head dims: MLA's ``Dv`` below ``Dqk`` is not
  padded, splash takes it as it is), transposed to ``[B, H, S, D]`` for the kernel, whose output
  ``[B, Hq, S, Dv]`` (q's dtype) is transposed back; ``sinks`` ``[Hq]`` (GPT-OSS's attention sinks)
  where given.
* **Residuals**, what splash's ``custom_vjp`` forward keeps (``_splash_attention_fwd``): q, k, v (as
  the kernel takes them), the sinks, the output and the log-sum-exp (float32 ``[B, Hq, S]``); the
  output and log-sum-exp tagged ``context`` inside the forward, as MaxText's
  ``residual_checkpoint_name="context"`` tags them.  Its mask infos are constants, its segment ids
  the layer's (loop-invariant) input: neither is a per-layer residual.
* **Backward**: dq, dk, dv of the inputs' shapes and dtypes from one opaque kernel (splash's
  backward keeps its blocks in VMEM: no score matrix, no HBM workspace), and the sinks' gradient in
  XLA as splash computes it (``-exp(sinks - lse) · out · dout``, summed).
* **Not modelled**: the kernel's mask (causal, sliding window, chunked) and logit soft cap, which
  change which blocks it computes, not what it reads, writes or keeps; its matmul FLOPs (the kernel
  is opaque: the traced layer counts none of them, as with cuDNN's custom call).

The kernel primitives have no evaluation or lowering rule: the stand-in is traced (``make_jaxpr``,
``eval_shape``, ``vjp``), never run.  What MaxText's splash path accepts but the stand-in does not
price (autoregressive decode, the sparse indexer's mask, max-logit recording, block diffusion,
compressed attention, ragged attention) is refused, naming it.
"""

from __future__ import annotations

import contextlib
import inspect

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import Primitive

from tierax.errors import TieraxError
from tierax.models.attention import FUSED_SCOPE

# MaxText's attention value whose TPU kernel (splash attention) this stands in for.
KERNEL = "flash"
# The checkpoint name splash attention gives its saved output and log-sum-exp in MaxText.
RESIDUAL_NAME = "context"


def _fwd_abstract(q, k, v):
    _check_shapes(q, k, v)
    b, h, s, _ = q.shape
    return (
        jax.core.ShapedArray((b, h, s, v.shape[-1]), q.dtype),
        jax.core.ShapedArray((b, h, s), jnp.float32),
    )


def _bwd_abstract(q, k, v, out, lse, dout):
    return tuple(jax.core.ShapedArray(x.shape, x.dtype) for x in (q, k, v))


def _check_shapes(q, k, v):
    if not (q.ndim == k.ndim == v.ndim == 4):
        raise TieraxError(
            f"splash attention's stand-in takes [B, H, S, D] q, k, v; got {q.shape}, {k.shape}, "
            f"{v.shape}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1] or q.shape[0] != k.shape[0]:
        raise TieraxError(
            f"splash attention's stand-in: q {q.shape}, k {k.shape}, v {v.shape} do not pair "
            "(q and k share a head dim; k and v batch, heads and length)"
        )
    if q.shape[1] % k.shape[1]:
        raise TieraxError(
            f"splash attention's stand-in: {q.shape[1]} query heads do not group over "
            f"{k.shape[1]} kv heads"
        )


_fwd_p = Primitive("tierax_splash_stand_in_fwd")
_fwd_p.multiple_results = True
_fwd_p.def_abstract_eval(_fwd_abstract)
_bwd_p = Primitive("tierax_splash_stand_in_bwd")
_bwd_p.multiple_results = True
_bwd_p.def_abstract_eval(_bwd_abstract)


def _kernel_fwd(q, k, v):
    # The fused scope marks the kernel as one boundary (tierax.tracing.hbm): what it reads and
    # writes crosses HBM, what runs inside it does not.
    with jax.named_scope(FUSED_SCOPE):
        out, lse = _fwd_p.bind(q, k, v)
    out = checkpoint_name(out, RESIDUAL_NAME)
    lse = checkpoint_name(lse, RESIDUAL_NAME)
    return out, lse


def _kernel_bwd(q, k, v, out, lse, dout):
    with jax.named_scope(FUSED_SCOPE):
        return tuple(_bwd_p.bind(q, k, v, out, lse, dout))


@jax.custom_vjp
def _splash(q, k, v):
    return _kernel_fwd(q, k, v)[0]


def _splash_fwd(q, k, v):
    out, lse = _kernel_fwd(q, k, v)
    return out, (q, k, v, out, lse)


def _splash_bwd(res, dout):
    return _kernel_bwd(*res, dout)


_splash.defvjp(_splash_fwd, _splash_bwd)


def _sinks_grad(sinks, out, lse, dout):
    """Splash attention's gradient of its sinks (computed in XLA after its backward kernels)."""
    e = -jnp.exp(sinks.astype(jnp.float32)[None, :, None, None] - lse[..., None])
    g = e * out.astype(jnp.float32) * dout.astype(jnp.float32)
    return jnp.sum(g, axis=(0, 2, 3)).astype(sinks.dtype)


@jax.custom_vjp
def _splash_sinks(q, k, v, sinks):
    return _kernel_fwd(q, k, v)[0]


def _splash_sinks_fwd(q, k, v, sinks):
    out, lse = _kernel_fwd(q, k, v)
    return out, (q, k, v, sinks, out, lse)


def _splash_sinks_bwd(res, dout):
    q, k, v, sinks, out, lse = res
    return (*_kernel_bwd(q, k, v, out, lse, dout), _sinks_grad(sinks, out, lse, dout))


_splash_sinks.defvjp(_splash_sinks_fwd, _splash_sinks_bwd)


def splash_stand_in(query, key, value, sinks=None):
    """Splash attention's stand-in on MaxText's ``[B, S, H, D]`` q, k, v (and ``[Hq]`` sinks):
    ``[B, S, Hq, Dv]`` in q's dtype (module docstring)."""
    q, k, v = (jnp.transpose(x, (0, 2, 1, 3)) for x in (query, key, value))
    if sinks is None:
        out = _splash(q, k, v)
    else:
        if sinks.shape != (q.shape[1],):
            raise TieraxError(
                f"splash attention's stand-in: sinks {sinks.shape}, one per query head "
                f"({q.shape[1]},) expected"
            )
        out = _splash_sinks(q, k, v, sinks)
    return jnp.transpose(out, (0, 2, 1, 3))


# apply_attention arguments whose use (set, or true) the stand-in does not price.
_UNPRICED = {
    "use_ragged_attention": "ragged attention",
    "indexer_mask": "a sparse indexer's mask",
    "compressed_mask": "compressed attention",
    "record_max_logits": "max-logit recording (QK-clip)",
    "previous_chunk": "chunked prefill",
}


def _apply_attention(original):
    signature = inspect.signature(original)

    def apply_attention(self, query, key, value, *args, **kwargs):
        if self.attention_kernel != KERNEL:
            return original(self, query, key, value, *args, **kwargs)
        from maxtext.common.common_types import MODEL_MODE_TRAIN, AttentionType

        bound = signature.bind(self, query, key, value, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if a["model_mode"] != MODEL_MODE_TRAIN:
            raise TieraxError(
                f"splash attention's stand-in prices MaxText's training step; its layer was "
                f"called in model_mode={a['model_mode']}"
            )
        for arg, what in _UNPRICED.items():
            if a.get(arg) is not None and a.get(arg) is not False:
                raise TieraxError(
                    f"MaxText's attention here uses {what} ({arg}), which the TPU trace's splash "
                    "attention stand-in does not price"
                )
        kind = getattr(self, "attention_type", None)
        if kind in (AttentionType.COMPRESSED, AttentionType.BLOCK_DIFFUSION):
            raise TieraxError(
                f"MaxText's attention here is {kind.value}, whose splash kernel the TPU trace's "
                "stand-in does not price"
            )
        for x, role in ((key, "key"), (value, "value")):
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                raise TieraxError(
                    f"MaxText's attention {role} is a {type(x).__name__} (a quantized KV cache), "
                    "which the TPU trace's splash attention stand-in does not price"
                )
        if query.shape[0] != key.shape[0]:
            raise TieraxError(
                f"splash attention's stand-in: query batch {query.shape[0]} and key batch "
                f"{key.shape[0]} differ"
            )
        return splash_stand_in(query, key, value, a.get("sinks")), None, None

    return apply_attention


@contextlib.contextmanager
def standing_in():
    """While active, MaxText's attention op with ``attention=flash`` runs :func:`splash_stand_in`
    (every other kernel runs as MaxText's own code does)."""
    from maxtext.layers import attention_op

    cls = attention_op.AttentionOp
    original = cls.__dict__["apply_attention"]
    cls.apply_attention = _apply_attention(original)
    try:
        yield
    finally:
        cls.apply_attention = original
