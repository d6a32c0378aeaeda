"""Causal softmax attention in two XLA forms.

* ``xla``: scores → softmax → context; materialises the B×K×G×S×T score matrix
  (and saves it for the backward pass).  Simple, and the reference.
* ``blockwise``: flash-attention's algorithm written in XLA (Dao et al. 2022):
  a ``lax.scan`` over key/value blocks with a running max and sum in float32,
  and a custom VJP that recomputes each block's probabilities from the saved
  log-sum-exp.  Nothing of size S×T is ever held: the residuals are q, k, v, the
  output and the log-sum-exp.  This is what a deviceless GPU compile needs to give
  memory figures that mean something at long sequence (no cuDNN there).

Both compute every block (masked), i.e. the full S×T of matmul work.
Shapes: q [B,S,K,G,d], k [B,T,K,d], v [B,T,K,dv] → [B,S,K,G,dv].
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

_NEG = -1e30


def xla_attention(q, k, v):
    scale = 1.0 / math.sqrt(q.shape[-1])
    s_BKGST = jnp.einsum("bskgd,btkd->bkgst", q, k).astype(jnp.float32) * scale
    S, T = s_BKGST.shape[-2], s_BKGST.shape[-1]
    mask_ST = jnp.tril(jnp.ones((S, T), dtype=bool))
    s_BKGST = jnp.where(mask_ST, s_BKGST, jnp.finfo(jnp.float32).min)
    p_BKGST = jax.nn.softmax(s_BKGST, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgst,btkv->bskgv", p_BKGST, v)


def _blocks(x, block):
    B, T = x.shape[:2]
    return x.reshape(B, T // block, block, *x.shape[2:]).swapaxes(0, 1)  # [nb, B, blk, ...]


def _scores(q, kb, j, block, scale):
    s = jnp.einsum("bskgd,btkd->bkgst", q, kb).astype(jnp.float32) * scale
    S = q.shape[1]
    q_pos = jnp.arange(S)[:, None]
    k_pos = j * block + jnp.arange(block)[None, :]
    return jnp.where(k_pos <= q_pos, s, _NEG)


def _forward(q, k, v, block):
    B, S, K, G, _ = q.shape
    dv = v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1])

    def body(carry, inp):
        m, l, acc = carry
        kb, vb, j = inp
        s = _scores(q, kb, j, block, scale)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        l_new = l * corr + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bkgst,btkv->bkgsv", p.astype(v.dtype), vb).astype(jnp.float32)
        return (m_new, l_new, acc * corr[..., None] + pv), None

    init = (jnp.full((B, K, G, S), _NEG, jnp.float32), jnp.zeros((B, K, G, S), jnp.float32),
            jnp.zeros((B, K, G, S, dv), jnp.float32))
    nb = k.shape[1] // block
    (m, l, acc), _ = jax.lax.scan(body, init, (_blocks(k, block), _blocks(v, block), jnp.arange(nb)))
    out_BKGSv = acc / l[..., None]
    lse = m + jnp.log(l)
    return jnp.moveaxis(out_BKGSv, 3, 1).astype(v.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _blockwise(q, k, v, block):
    return _forward(q, k, v, block)[0]


def _blockwise_fwd(q, k, v, block):
    out, lse = _forward(q, k, v, block)
    return out, (q, k, v, out, lse)


def _blockwise_bwd(block, res, d_out):
    q, k, v, out, lse = res
    scale = 1.0 / math.sqrt(q.shape[-1])
    do = jnp.moveaxis(d_out, 1, 3).astype(jnp.float32)  # [B,K,G,S,dv]
    delta = jnp.sum(do * jnp.moveaxis(out, 1, 3).astype(jnp.float32), axis=-1)  # [B,K,G,S]

    def body(dq, inp):
        kb, vb, j = inp
        p = jnp.exp(_scores(q, kb, j, block, scale) - lse[..., None])  # [B,K,G,S,blk]
        dv_b = jnp.einsum("bkgst,bkgsv->btkv", p, do)
        dp = jnp.einsum("bkgsv,btkv->bkgst", do, vb.astype(jnp.float32))
        ds = p * (dp - delta[..., None]) * scale
        dq = dq + jnp.einsum("bkgst,btkd->bskgd", ds, kb.astype(jnp.float32))
        dk_b = jnp.einsum("bkgst,bskgd->btkd", ds, q.astype(jnp.float32))
        return dq, (dk_b, dv_b)

    nb = k.shape[1] // block
    dq, (dk, dv) = jax.lax.scan(body, jnp.zeros(q.shape, jnp.float32),
                                (_blocks(k, block), _blocks(v, block), jnp.arange(nb)))
    B, T = k.shape[:2]
    dk = dk.swapaxes(0, 1).reshape(B, T, *k.shape[2:])
    dv = dv.swapaxes(0, 1).reshape(B, T, *v.shape[2:])
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def causal_attention(q, k, v, *, impl: str = "xla", block: int = 512):
    """Causal attention; ``impl`` is ``xla`` or ``blockwise`` (block size ``block`` keys)."""
    if impl == "xla":
        return xla_attention(q, k, v)
    T = k.shape[1]
    block = min(block, T)
    while T % block:  # the largest block ≤ requested that divides the sequence
        block -= 1
    return _blockwise(q, k, v, block)
