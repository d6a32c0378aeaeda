"""Causal softmax attention in two XLA forms.

* ``xla``: scores → softmax → context; materialises the B×K×G×S×T score matrix
  (and saves it for the backward pass).  Simple, and the reference.
* ``blockwise``: flash-attention's algorithm written in XLA (Dao et al. 2022):
  query blocks × a ``lax.scan`` over key/value blocks with a running max and sum
  in float32, and a custom VJP that recomputes each block's probabilities from the
  saved log-sum-exp.  One [B, K, G, block, block] score block exists at a time
  (S×block before query blocking: 8.6 GB per layer for DeepSeek-V3 at 8 × 4096);
  the residuals are q, k, v, the output and the log-sum-exp.  This is what a deviceless GPU compile needs to give
  memory figures that mean something at long sequence (no cuDNN there).

Both compute every block (masked), i.e. the full S×T of matmul work.
Shapes: q [B,S,K,G,d], k [B,T,K,d], v [B,T,K,dv] → [B,S,K,G,dv].

Document masking: with ``segment_ids`` [B, S] (self-attention, S = T), a query attends to a
key only if the key is not later *and* in the same segment (the packed document it belongs
to), in every implementation.  Without it (the default) the mask is causal only.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

_NEG = -1e30


def _same_segment(seg_q, seg_k):
    """[B, Sq, Tk] bool: query and key in the same document."""
    return seg_q[:, :, None] == seg_k[:, None, :]


def xla_attention(q, k, v, segment_ids=None):
    # Both einsums are plain 4-D batched matmuls with no score-sized transposes.  With one query
    # head per kv head (G = 1) they are written on [B, S, H, d] directly; with G > 1 the queries go
    # to [B, K, G·S, d] first (an activation-sized transpose).  Written as "bskgd,btkd->bkgst",
    # XLA's dot emits [b,k,s,g,t] and copies every score-sized tensor into [b,k,g,s,t], forward and
    # backward (a size-1 G keeps those copies on CPU).
    B, S, K, G, d = q.shape
    T = k.shape[1]
    scale = 1.0 / math.sqrt(d)
    if G == 1:
        s_BKST = jnp.einsum("bskd,btkd->bkst", q[:, :, :, 0], k).astype(jnp.float32) * scale
        mask = jnp.tril(jnp.ones((S, T), dtype=bool))
        if segment_ids is not None:
            mask = mask[None, None] & _same_segment(segment_ids, segment_ids)[:, None]
        s_BKST = jnp.where(mask, s_BKST, jnp.finfo(jnp.float32).min)
        p_BKST = jax.nn.softmax(s_BKST, axis=-1).astype(v.dtype)
        return jnp.einsum("bkst,btkv->bskv", p_BKST, v)[:, :, :, None, :]
    q_BKQd = jnp.transpose(q, (0, 2, 3, 1, 4)).reshape(B, K, G * S, d)  # Q = (g, s)
    s_BKQT = jnp.einsum("bkqd,btkd->bkqt", q_BKQd, k).astype(jnp.float32) * scale
    pos_Q = jnp.tile(jnp.arange(S), G)  # the query position of each (g, s) row
    mask_QT = pos_Q[:, None] >= jnp.arange(T)[None, :]
    if segment_ids is not None:  # rows are (g, s): the query segments repeat G times
        same_QT = _same_segment(jnp.tile(segment_ids, (1, G)), segment_ids)
        mask_QT = mask_QT[None, None] & same_QT[:, None]
    s_BKQT = jnp.where(mask_QT, s_BKQT, jnp.finfo(jnp.float32).min)
    p_BKQT = jax.nn.softmax(s_BKQT, axis=-1).astype(v.dtype)
    out_BKQv = jnp.einsum("bkqt,btkv->bkqv", p_BKQT, v)
    return jnp.transpose(out_BKQv.reshape(B, K, G, S, v.shape[-1]), (0, 3, 1, 2, 4))


def _blocks(x, block):
    B, T = x.shape[:2]
    return x.reshape(B, T // block, block, *x.shape[2:]).swapaxes(0, 1)  # [nb, B, blk, ...]


def _scores(qb, kb, i, j, block, scale, seg=None):
    """Masked scores of query block ``i`` against key block ``j``: [B, K, G, blk, blk] float32.

    ``seg``: the whole [B, S] segment ids (None: causal only); the blocks' own are sliced here.
    """
    s = jnp.einsum("bskgd,btkd->bkgst", qb, kb).astype(jnp.float32) * scale
    q_pos = i * block + jnp.arange(qb.shape[1])[:, None]
    k_pos = j * block + jnp.arange(block)[None, :]
    mask = k_pos <= q_pos
    if seg is not None:
        seg_q = jax.lax.dynamic_slice_in_dim(seg, i * block, qb.shape[1], axis=1)
        seg_k = jax.lax.dynamic_slice_in_dim(seg, j * block, block, axis=1)
        mask = mask[None, None, None] & _same_segment(seg_q, seg_k)[:, None, None]
    return jnp.where(mask, s, _NEG)


def _forward(q, k, v, block, seg=None):
    """(out [B,S,K,G,dv], lse [B,K,G,S]): an outer loop over query blocks, an inner scan over key blocks."""
    B, S, K, G, _ = q.shape
    dv = v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    nb = k.shape[1] // block
    k_blocks, v_blocks = _blocks(k, block), _blocks(v, block)

    def one_query_block(args):
        qb, i = args

        def body(carry, inp):
            m, l, acc = carry
            kb, vb, j = inp
            s = _scores(qb, kb, i, j, block, scale, seg)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            corr = jnp.exp(m - m_new)
            l_new = l * corr + jnp.sum(p, axis=-1)
            pv = jnp.einsum("bkgst,btkv->bkgsv", p.astype(v.dtype), vb).astype(jnp.float32)
            return (m_new, l_new, acc * corr[..., None] + pv), None

        qn = qb.shape[1]
        init = (jnp.full((B, K, G, qn), _NEG, jnp.float32), jnp.zeros((B, K, G, qn), jnp.float32),
                jnp.zeros((B, K, G, qn, dv), jnp.float32))
        (m, l, acc), _ = jax.lax.scan(body, init, (k_blocks, v_blocks, jnp.arange(nb)))
        return jnp.moveaxis(acc / l[..., None], 3, 1).astype(v.dtype), m + jnp.log(l)

    nq = S // block
    out_n, lse_n = jax.lax.map(one_query_block, (_blocks(q, block), jnp.arange(nq)))
    out = out_n.swapaxes(0, 1).reshape(B, S, K, G, dv)
    lse = jnp.moveaxis(lse_n, 0, 3).reshape(B, K, G, S)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _blockwise(q, k, v, seg, block):
    return _forward(q, k, v, block, seg)[0]


def _blockwise_fwd(q, k, v, seg, block):
    out, lse = _forward(q, k, v, block, seg)
    return out, (q, k, v, seg, out, lse)


def _blockwise_bwd(block, res, d_out):
    """Outer scan over key blocks (their dk, dv are local), inner scan over query blocks
    (dq accumulated in place): one [B, K, G, blk, blk] probability block at a time."""
    q, k, v, seg, out, lse = res
    B, S, K, G, d = q.shape
    scale = 1.0 / math.sqrt(d)
    do = d_out.astype(jnp.float32)  # [B,S,K,G,dv]
    delta = jnp.sum(do * out.astype(jnp.float32), axis=-1)  # [B,S,K,G]
    nq, nb = S // block, k.shape[1] // block
    q_blocks = _blocks(q, block)
    do_blocks = _blocks(do, block)
    lse_blocks = _blocks(jnp.moveaxis(lse, 3, 1), block)  # [nq,B,blk,K,G]
    delta_blocks = _blocks(delta, block)

    def key_block(dq, inp):
        kb, vb, j = inp
        kb32, vb32 = kb.astype(jnp.float32), vb.astype(jnp.float32)

        def query_block(carry, qin):
            dq, dk_b, dv_b = carry
            qb, dob, lseb, deltab, i = qin
            lse_i = jnp.moveaxis(lseb, 1, 3)  # [B,K,G,blk]
            s = _scores(qb, kb, i, j, block, scale, seg)
            p = jnp.exp(s - lse_i[..., None])  # [B,K,G,blk,blk]
            dob_t = jnp.moveaxis(dob, 1, 3)  # [B,K,G,blk,dv]
            dv_b = dv_b + jnp.einsum("bkgst,bkgsv->btkv", p, dob_t)
            dp = jnp.einsum("bkgsv,btkv->bkgst", dob_t, vb32)
            ds = p * (dp - jnp.moveaxis(deltab, 1, 3)[..., None]) * scale
            dq_i = jnp.einsum("bkgst,btkd->bskgd", ds, kb32)
            dq = jax.lax.dynamic_update_slice_in_dim(
                dq, jax.lax.dynamic_slice_in_dim(dq, i * block, block, axis=1) + dq_i, i * block, axis=1
            )
            dk_b = dk_b + jnp.einsum("bkgst,bskgd->btkd", ds, qb.astype(jnp.float32))
            return (dq, dk_b, dv_b), None

        init = (dq, jnp.zeros(kb.shape, jnp.float32), jnp.zeros(vb.shape, jnp.float32))
        (dq, dk_b, dv_b), _ = jax.lax.scan(
            query_block, init, (q_blocks, do_blocks, lse_blocks, delta_blocks, jnp.arange(nq))
        )
        return dq, (dk_b, dv_b)

    dq, (dk, dv) = jax.lax.scan(key_block, jnp.zeros(q.shape, jnp.float32),
                                (_blocks(k, block), _blocks(v, block), jnp.arange(nb)))
    T = k.shape[1]
    dk = dk.swapaxes(0, 1).reshape(B, T, *k.shape[2:])
    dv = dv.swapaxes(0, 1).reshape(B, T, *v.shape[2:])
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def causal_attention(q, k, v, *, impl: str = "xla", block: int = 512, segment_ids=None):
    """Causal attention; ``impl`` is ``xla`` or ``blockwise`` (block size ``block`` keys).

    ``segment_ids``: int [B, S] document ids of a packed batch (None: one document per row);
    a query then sees only earlier keys of its own document.  Every implementation added here
    (a fused GPU kernel) must take them too, or refuse them: ignoring them would let packed
    documents attend to each other silently.
    """
    if impl == "xla":
        return xla_attention(q, k, v, segment_ids)
    T = k.shape[1]
    block = min(block, T)
    while T % block:  # the largest block ≤ requested that divides the sequence
        block -= 1
    return _blockwise(q, k, v, segment_ids, block)
