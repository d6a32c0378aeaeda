"""Next-token cross-entropy computed in tiles: the full [tokens, vocab] logits never exist.

The final hidden states [B, S, D] are cut into ``tiles`` chunks along the sequence
(each chunk keeps the whole batch, so it stays split over the batch axes like the
activations), and a ``lax.scan`` computes one chunk's logits, log-sum-exp and target
logit at a time.  The scan body is wrapped in ``jax.checkpoint``, so the backward
pass recomputes each chunk's logits instead of keeping them: forward and backward
hold one [B, S/tiles, V] float32 chunk at a time (MaxText's ``num_vocab_tiling``
chunks batch × sequence the same way).  ``tiles=1`` is the plain untiled loss.

On TPU the head matmul's output, the logits, is in the compute dtype (the MXU accumulates in
float32 and rounds once), as MaxText's default (``logits_dot_in_fp32: false``); the log-sum-exp
and the softmax are float32 from it.  Elsewhere the logits are float32.  (:func:`logits_dtype`.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tierax.errors import TieraxError
from tierax.mesh import BATCH_AXES, constrain


def check_tiles(tiles: int, seq: int) -> None:
    """Refuse a tiling that does not divide the sequence (message names the numbers and fix)."""
    if not isinstance(tiles, int) or isinstance(tiles, bool) or tiles < 1:
        raise TieraxError(f"loss_tiles must be an integer ≥ 1, got {tiles!r}")
    if seq % tiles:
        divisors = [d for d in range(1, seq + 1) if seq % d == 0]
        near = min(divisors, key=lambda d: (abs(d - tiles), d))
        raise TieraxError(
            f"loss_tiles={tiles} does not divide the sequence length {seq} (the loss is tiled "
            f"along the sequence of every batch row); use a divisor of {seq}, e.g. "
            f"loss_tiles={near}"
        )


def logits_dtype(compute_dtype, platform: str | None):
    """The logits' dtype: the compute dtype on TPU, float32 elsewhere.

    On TPU a float32 [tokens, vocab] buffer dominated the step's peak (saved for the backward
    beside the logits' gradient): tierax's remat-full Llama 3 8B step did not fit XLA:TPU where
    MaxText's, with compute-dtype logits, did (``bench/results/estimator_peer.json``).
    """
    return jnp.dtype(compute_dtype) if platform == "tpu" else jnp.dtype(jnp.float32)


def _chunk_nll(mesh, platform: str | None):
    """``nll(h_BsD, weight_DV, targets_Bs)``: −log softmax(h @ W)[target] per position."""

    @jax.custom_vjp
    def nll(h_BsD, weight_DV, targets_Bs):
        return fwd(h_BsD, weight_DV, targets_Bs)[0]

    def fwd(h_BsD, weight_DV, targets_Bs):
        out = logits_dtype(h_BsD.dtype, platform)
        logits_BsV = jnp.einsum("bsd,dv->bsv", h_BsD, weight_DV, preferred_element_type=out)
        logits_BsV = constrain(logits_BsV, mesh, BATCH_AXES, None, None)
        lse_Bs = jax.nn.logsumexp(logits_BsV.astype(jnp.float32), axis=-1)
        # The target logit is picked from the logits as stored: a gather from a float32 copy would
        # make XLA write that copy out in full.
        picked_Bs = jnp.take_along_axis(logits_BsV, targets_Bs[..., None], axis=-1)[..., 0]
        target_Bs = picked_Bs.astype(jnp.float32)
        return lse_Bs - target_Bs, (h_BsD, weight_DV, logits_BsV, lse_Bs, targets_Bs)

    def bwd(res, g_Bs):
        # (softmax − one-hot) · g in one elementwise pass over the logits, in the compute dtype.
        # Differentiated by JAX, the target pick (take_along_axis) scatters into a zeroed [B, s, V]
        # array that is added: two more passes.  (A scatter of −g at the targets into softmax·g cost
        # XLA:TPU another logits-sized buffer of temp in tests/test_tpu.py's v5p plan.)
        # The head's two backward matmuls then run in the compute dtype, like every other matmul of
        # the step: JAX's own transpose of the float32-output einsum multiplies the float32
        # gradient, and XLA converts the bfloat16 head and hidden states to float32 for it (float32
        # GEMMs on a GPU).
        h_BsD, weight_DV, logits_BsV, lse_Bs, targets_Bs = res
        hit_BsV = (
            jax.lax.broadcasted_iota(targets_Bs.dtype, logits_BsV.shape, logits_BsV.ndim - 1)
            == targets_Bs[..., None]
        )
        d_BsV = (
            (jnp.exp(logits_BsV.astype(jnp.float32) - lse_Bs[..., None]) - hit_BsV)
            * g_Bs[..., None]
        ).astype(h_BsD.dtype)
        d_BsV = constrain(d_BsV, mesh, BATCH_AXES, None, None)
        if platform != "tpu":
            # Materialised once: without the barrier XLA:CPU fused the pass into both of its
            # readers (the head's input gradient and the transposed copy for its weight gradient)
            # and kept the softmax as a third [tokens, vocab] buffer (+129 MB temp at d_model 512,
            # vocab 32000).  XLA:TPU instead fuses it into both matmuls' operands and never writes
            # the gradient out (tests/test_tpu.py).
            d_BsV = jax.lax.optimization_barrier(d_BsV)
        dh_BsD = jnp.einsum("bsv,dv->bsd", d_BsV, weight_DV, preferred_element_type=jnp.float32)
        dw_DV = jnp.einsum("bsd,bsv->dv", h_BsD, d_BsV, preferred_element_type=jnp.float32)
        return dh_BsD.astype(h_BsD.dtype), dw_DV.astype(weight_DV.dtype), None

    nll.defvjp(fwd, bwd)
    return nll


def _chunk_nll_sum(h_BsD, weight_DV, targets_Bs, mesh, platform, w_Bs=None):
    """Sum over the chunk of −log p(target) (times ``w_Bs``): the logits never leave here."""
    nll_Bs = _chunk_nll(mesh, platform)(h_BsD, weight_DV, targets_Bs)
    return jnp.sum(nll_Bs if w_Bs is None else nll_Bs * w_Bs)


def cross_entropy(
    hidden_BSD,
    weight_DV,
    targets_BS,
    *,
    tiles: int = 1,
    mesh=None,
    weights_BS=None,
    platform: str | None = None,
):
    """Mean next-token cross-entropy (float32) of logits ``hidden_BSD @ weight_DV`` against
    ``targets_BS``.

    Args:
      hidden_BSD: final hidden states (after the final norm), compute dtype.
      weight_DV: the LM head ([D, V], compute dtype).
      targets_BS: int target ids.
      tiles: chunks along the sequence; 1 computes the logits in one piece.
      mesh: the step's :class:`jax.sharding.Mesh` (None: one device).
      weights_BS: float32 weight of each target (packed documents: 0 where the target is in
        another document); the mean is then over the weights.  None: every target counts.
      platform: where the step runs ("tpu", "gpu", "cpu"; None: not TPU): picks
        :func:`logits_dtype`.

    Raises:
      TieraxError: ``tiles`` does not divide the sequence length.
    """
    B, S, D = hidden_BSD.shape
    check_tiles(tiles, S)
    if tiles == 1:
        total = _chunk_nll_sum(hidden_BSD, weight_DV, targets_BS, mesh, platform, weights_BS)
    else:
        s = S // tiles
        h_nBsD = hidden_BSD.reshape(B, tiles, s, D).swapaxes(0, 1)
        t_nBs = targets_BS.reshape(B, tiles, s).swapaxes(0, 1)
        w_nBs = None if weights_BS is None else weights_BS.reshape(B, tiles, s).swapaxes(0, 1)

        @jax.checkpoint  # the backward recomputes the chunk's logits rather than keeping them
        def body(acc, xs):
            h_BsD, t_Bs, w_Bs = xs
            return acc + _chunk_nll_sum(h_BsD, weight_DV, t_Bs, mesh, platform, w_Bs), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (h_nBsD, t_nBs, w_nBs))
    if weights_BS is None:
        return total / (B * S)
    return total / jnp.maximum(jnp.sum(weights_BS), 1.0)
