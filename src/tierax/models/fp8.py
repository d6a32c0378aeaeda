"""FP8 GEMMs with per-tensor delayed scaling (``quantization: fp8``, MaxText's key and value).

The recipe is Transformer Engine's delayed scaling, the one Flax's ``linen.fp8_ops`` and
MaxText's ``quantization: fp8`` run on GPUs: every GEMM's two inputs are quantized to
``float8_e4m3fn`` and its output gradient to ``float8_e5m2``, each with one float32 scale per
tensor (``x ≈ q · scale``).  A tensor's scale for this step comes from the largest magnitude seen
in the last :data:`AMAX_HISTORY` steps, ``scale = max(history) / fp8_max`` (kept unchanged while
the history holds no finite positive amax, e.g. 1.0 on the first step); the history is then
rolled and this step's amax written at its slot 0.  (Recipe: Transformer Engine's JAX
``update_fp8_metas``, margin 0; Flax ``linen.fp8_ops.compute_scale`` / ``compute_amax_history``.)

State.  Each GEMM owns two :class:`Fp8Meta` variables per quantized tensor (input, kernel, output
gradient): a scalar ``scale`` and a ``[AMAX_HISTORY]`` amax history, float32 (the routed experts
share one set per weight bank: per-tensor over all experts).  The embedding, the LM head, the
router, norms, attention's score GEMMs, the loss and the optimizer stay as they are.  The metas
live among the model's parameters (stacked per layer by the scanned layer groups like the
weights they scale, and replicated, tierax.sharding.rules), so they are checkpointed with them.
They are not trained: their "gradient" is their next value (Flax's ``_overwrite_with_gradient``
convention), which the train step writes in place of the optimizer's update
(:func:`split_meta`, :func:`overwrite_meta`).  Under gradient accumulation the microbatches'
new metas combine by maximum (:func:`combine_meta`): the history's new slot is the step's amax.

Numerics.  The GEMM is a ``dot_general`` of the two fp8 operands accumulated in float32, then
multiplied by the product of their scales: the form XLA:GPU's GEMM rewriter turns into a cuBLASLt
fp8 GEMM (``__cublas$lt$matmul$f8``) on Hopper and Blackwell, and that a deviceless compile
(no autotuning) leaves as Triton GEMM fusions of fp8 operands.  (Written instead as the dot of
the dequantized operands, a deviceless H200 compile held no f8 value at all.)  On a backend
without fp8 GEMMs (XLA:CPU) the same program runs the fp8 numerics emulated: the operands are the
fp8-rounded values, the products accumulate in float32.

What the backward keeps: the fp8 operands (a byte an element) are residuals of the GEMM's own
``custom_vjp`` and carry no checkpoint name; the activations a plan names (the GEMMs' outputs and
the tagged values between them) stay in the compute dtype.  So under a remat policy (every preset
but save-all) the step saves the named activations in the compute dtype and re-makes the fp8
copies in the backward pass (a quantization and an amax: HBM work, no GEMM); with no
rematerialisation (save-all) JAX keeps the fp8 copies themselves.  The inventory traces either
case (tierax.tracing.inventory), so the cost model counts the bytes the step actually saves.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from flax.linen import fp8_ops

from tierax.errors import TieraxError

AMAX_HISTORY = 1024  # MaxText / Flax fp8_ops' default amax_history_length
FORWARD = jnp.float8_e4m3fn  # inputs and kernels
BACKWARD = jnp.float8_e5m2  # output gradients
# The three quantized tensors of a GEMM, in the order of the meta arguments below.
ROLES = ("input", "kernel", "grad")


class Fp8Meta(nnx.Variable):
    """One float32 array of a GEMM's delayed-scaling state (a tensor's ``scale`` or its amax
    ``history``); a variable type of its own so that the train step finds it (:func:`split_meta`).
    Attribute names start with :data:`PREFIX` (tierax.sharding.rules replicates them)."""


PREFIX = "fp8_"


def fp8_max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def next_scale(scale, history, dtype):
    """This step's scale from the previous scale and the amax history (Transformer Engine's
    delayed scaling, margin 0): ``max(history) / fp8_max``, or ``scale`` while that amax is not
    finite and positive."""
    amax = jnp.max(history)
    ok = (amax > 0) & jnp.isfinite(amax)
    return jnp.where(ok, amax / fp8_max(dtype), scale)


def next_history(history, x):
    """``history`` rolled by one with ``max |x|`` written at slot 0."""
    amax = jnp.max(jnp.abs(x)).astype(history.dtype)
    return jnp.roll(history, -1).at[0].set(amax)


def quantize(x, dtype, scale):
    """``x / scale`` clipped to ``dtype``'s finite range and rounded to ``dtype``."""
    limit = fp8_max(dtype)
    return jnp.clip(x.astype(jnp.float32) / scale, -limit, limit).astype(dtype)


def _update(meta, x, dtype):
    """(quantized x, its scale, the meta the step leaves)."""
    scale = next_scale(meta["scale"], meta["history"], dtype)
    return (
        quantize(x, dtype, scale),
        scale,
        {"scale": scale, "history": next_history(meta["history"], x)},
    )


def _scaled_dot(qa, qb, scale, dims, out_dtype):
    """``dot(qa, qb) · scale`` on the fp8 operands themselves, accumulated in float32: the form
    XLA:GPU's GEMM rewriter turns into one cuBLASLt fp8 GEMM (its scales folded into the call)."""
    out = jax.lax.dot_general(qa, qb, dims, preferred_element_type=jnp.float32)
    return (out * scale).astype(out_dtype)


@partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def fp8_dot_general(x, w, x_meta, w_meta, g_meta, dims, compute_dtype: str):
    """``dot_general(x, w, dims)`` with both inputs in e4m3 and the output gradient in e5m2.

    ``x``, ``w``: in ``compute_dtype`` (the product's dtype too).  ``x_meta``/``w_meta``/
    ``g_meta``: the delayed-scaling state (``{"scale": [], "history": [n]}``) of the input, the
    kernel and the output gradient; their cotangents are their next values.
    """
    return _fwd(x, w, x_meta, w_meta, g_meta, dims, compute_dtype)[0]


def _fwd(x, w, x_meta, w_meta, g_meta, dims, compute_dtype):
    dt = jnp.dtype(compute_dtype)
    if x.dtype != dt or w.dtype != dt:
        raise TieraxError(
            f"fp8_dot_general: operands {x.dtype}, {w.dtype} must be in the compute dtype {dt}"
        )
    qx, sx, x_next = _update(x_meta, x, FORWARD)
    qw, sw, w_next = _update(w_meta, w, FORWARD)
    y = _scaled_dot(qx, qw, sx * sw, dims, dt)
    return y, (qx, sx, qw, sw, x_next, w_next, g_meta)


def _bwd(dims, compute_dtype, res, g):
    dt = jnp.dtype(compute_dtype)
    qx, sx, qw, sw, x_next, w_next, g_meta = res
    qg, sg, g_next = _update(g_meta, g, BACKWARD)
    # The dot's transposes with respect to each input (Flax's, on shapes and dimension numbers
    # only), each an e5m2 × e4m3 GEMM of the fp8 operands.
    dx = fp8_ops.dot_general_transpose_lhs(
        qg, qx, qw, dimension_numbers=dims, precision=None, preferred_element_type=jnp.float32
    )
    dw = fp8_ops.dot_general_transpose_rhs(
        qg, qx, qw, dimension_numbers=dims, precision=None, preferred_element_type=jnp.float32
    )
    return (dx * (sg * sw)).astype(dt), (dw * (sg * sx)).astype(dt), x_next, w_next, g_next


fp8_dot_general.defvjp(_fwd, _bwd)


def attach(module, prefix: str = PREFIX) -> None:
    """Give ``module`` the delayed-scaling state of one GEMM (input, kernel, output gradient) as
    attributes ``{prefix}{role}_scale`` / ``{prefix}{role}_history``."""
    for role in ROLES:
        setattr(module, f"{prefix}{role}_scale", Fp8Meta(jnp.ones((), jnp.float32)))
        setattr(module, f"{prefix}{role}_history", Fp8Meta(jnp.zeros((AMAX_HISTORY,), jnp.float32)))


def metas(module, prefix: str = PREFIX) -> tuple[dict, dict, dict]:
    """The (input, kernel, grad) metas :func:`attach` gave ``module``, as arrays."""
    return tuple(
        {
            "scale": getattr(module, f"{prefix}{role}_scale")[...],
            "history": getattr(module, f"{prefix}{role}_history")[...],
        }
        for role in ROLES
    )


class Fp8Linear(nnx.Module):
    """A bias-free linear layer ``x @ kernel`` with its GEMM in fp8 (the kernel's master copy in
    ``param_dtype``, the product in ``dtype``)."""

    def __init__(self, in_dim, out_dim, *, dtype, param_dtype, kernel_init, rngs: nnx.Rngs):
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_dim, out_dim), param_dtype))
        self.dtype = dtype
        attach(self)

    def __call__(self, x):
        dims = (((x.ndim - 1,), (0,)), ((), ()))
        dt = jnp.dtype(self.dtype)
        return fp8_dot_general(
            x.astype(dt), self.kernel[...].astype(dt), *metas(self), dims, dt.name
        )


EXPERT_FORMS = ("ecd,edf->ecf", "ecf,efd->ecd")


def einsum(spec: str, x, w, gemm_metas, compute_dtype):
    """An fp8 ``jnp.einsum`` for the expert GEMMs' batched forms :data:`EXPERT_FORMS` (the
    leading expert dimension shared, ``x``'s last dimension contracted with ``w``'s middle)."""
    if spec not in EXPERT_FORMS:
        raise TieraxError(f"fp8 einsum: unsupported form {spec!r}; supported: {EXPERT_FORMS}")
    dims = (((2,), (1,)), ((0,), (0,)))
    return fp8_dot_general(x, w, *gemm_metas, dims, jnp.dtype(compute_dtype).name)


def _is_meta(v) -> bool:
    return isinstance(v, Fp8Meta)


def split_meta(tree):
    """(``tree`` with every :class:`Fp8Meta` zeroed, ``tree`` itself): applied to the gradients,
    the first is what the optimizer sees, the second carries the metas' next values for
    :func:`overwrite_meta`.  A tree without Fp8Meta comes back unchanged."""
    zeroed = jax.tree.map(
        lambda v: jax.tree.map(jnp.zeros_like, v) if _is_meta(v) else v, tree, is_leaf=_is_meta
    )
    return zeroed, tree


def has_meta(tree) -> bool:
    return any(_is_meta(v) for v in jax.tree.leaves(tree, is_leaf=_is_meta))


def overwrite_meta(params, grads):
    """``params`` with each :class:`Fp8Meta` replaced by its gradient in ``grads`` (its next
    value), cast to the parameter's dtype."""
    return jax.tree.map(
        lambda p, g: jax.tree.map(lambda a, b: b.astype(a.dtype), p, g) if _is_meta(p) else p,
        params,
        grads,
        is_leaf=_is_meta,
    )


def combine_meta(acc, new):
    """Gradients accumulated over microbatches: each Fp8Meta by maximum (every microbatch starts
    from the same state, so the scale is the same and the history's new slot becomes the step's
    amax), every other leaf by sum."""
    return jax.tree.map(
        lambda a, g: jax.tree.map(jnp.maximum, a, g) if _is_meta(a) else a + g,
        acc,
        new,
        is_leaf=_is_meta,
    )
