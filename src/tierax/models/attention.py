"""Causal softmax attention: two XLA forms and cuDNN's fused flash attention.

* ``xla``: scores → softmax → context; materialises the B×K×G×S×T score matrix
  (and saves it for the backward pass).  Simple, and the reference.
* ``blockwise``: flash-attention's algorithm written in XLA (Dao et al. 2022):
  one ``lax.scan`` over the (query block, key block) pairs the causal mask leaves
  visible, with a running max and sum in float32, and a custom VJP that recomputes
  each block's probabilities from the saved log-sum-exp.  One [B, K, G, block, block]
  score block exists at a time (S×block before query blocking: 8.6 GB per layer for
  DeepSeek-V3 at 8 × 4096); the residuals are q, k, v, the output and the
  log-sum-exp.  This is what a deviceless GPU compile needs to give memory figures
  that mean something at long sequence (no cuDNN there).

``xla`` computes the full S×T of matmul work (masked).  ``blockwise`` skips the key
blocks wholly above the diagonal: nq·(nq+1)/2 of the nq² blocks (nq = S / block), about
half the work at long sequence; its backward recomputes each block's scores (one more
matmul per block than ``xla``'s backward).  Blockwise is self-attention only (S == T).

* ``cudnn``: cuDNN's fused flash attention through ``jax.nn.dot_product_attention``
  (``implementation="cudnn"``, causal) — what GPU trainers run (MaxText's
  ``cudnn_flash_te``): score blocks stay on chip; residuals are q, k, v, the output and the
  float32 softmax statistics.  JAX's public API needs v's head dim to equal q/k's, so an MLA
  layer (q/k 192, v 128) zero-pads v to the q/k head dim and slices the output
  (:func:`padded_value_attention`): the padded v and output are what the kernel saves, and
  the P·V products grow by d_qk / d_v.  It runs only on a CUDA GPU (or in a deviceless CUDA
  compile); ``cudnn_blockwise`` is the same route — padded value, same residuals — with the
  blockwise XLA math, which is what abstract traces on the host (the inventory) and CPU
  tests run.

* ``splash``: the Pallas TPU splash-attention kernel
  (``jax.experimental.pallas.ops.tpu.splash_attention``, causal mask, query heads ordered (k, g) so
  query head n reads kv head n // G) — what MaxText's TPU runs use (``attention: flash``).  Its
  residuals are q, k, v, the output and the float32 log-sum-exp, as cuDNN's; an MLA layer's v is
  zero-padded to the q/k head dim as for cuDNN (:func:`padded_value_attention`).  Packed documents
  are masked by the kernel's segment ids.  It compiles through Mosaic for a TPU only (or in a
  deviceless TPU compile); on a mesh it runs under ``shard_map`` (batch over the batch axes, kv
  heads over ``tensor``), since XLA cannot partition the kernel.  ``interpret=True`` runs it with
  Pallas's interpreter on any backend (the CPU tests).  ``splash_blockwise`` is its stand-in for
  host traces: the blockwise XLA math in the fused scope at the kernel's block size, with the
  same residuals, its log-sum-exp written 128 lanes wide as the kernel writes it
  (:data:`SPLASH_LSE_LANES`).

Shapes: q [B,S,K,G,d], k [B,T,K,d], v [B,T,K,dv] → [B,S,K,G,dv].

Document masking: with ``segment_ids`` [B, S] (self-attention, S = T), a query attends to a
key only if the key is not later *and* in the same segment (the packed document it belongs
to), in ``xla``, ``blockwise`` and ``cudnn_blockwise``.  ``cudnn`` refuses them: JAX's public
cuDNN entry takes no segment ids, and ignoring them would let packed documents attend to each
other silently.  Without them (the default) the mask is causal only.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from tierax.errors import TieraxError

_NEG = -1e30
# Name scope around the host-traceable stand-in of a fused attention kernel (``cudnn_blockwise``).
FUSED_SCOPE = "tierax_fused_attention"
FUSED_TILE = 128
# Splash attention's query/key block: the largest of these that divides the sequence (MaxText's
# sa_block_* defaults are 512); the kernel's lanes need a multiple of 128.
SPLASH_BLOCKS = (512, 256, 128)
# The splash kernel writes its forward's log-sum-exp as float32 [heads, seq, 128]: the value
# repeated across a vector register's 128 lanes (jax.experimental.pallas.ops.tpu.splash_attention,
# the forward's ``logsumexp`` output of NUM_LANES); its wrapper slices one lane for the backward.
# The stand-in writes the same buffer, so a layer's backward that recomputes the attention holds it
# (tests/test_splash_lse.py: the buffer beside the kernel's own traced call, and the fit boundary it
# moves beside XLA:TPU's compile).
SPLASH_LSE_LANES = 128


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


def _pairs(nq: int, *, by_key: bool) -> tuple[np.ndarray, np.ndarray]:
    """The (query block i, key block j ≤ i) pairs the causal mask leaves any key visible in, as
    two int32 index arrays: ordered by i then j (forward) or by j then i (``by_key``, backward).
    A block j > i is wholly masked and never computed: nq·(nq+1)/2 pairs instead of nq²."""
    if by_key:
        pairs = [(i, j) for j in range(nq) for i in range(j, nq)]
    else:
        pairs = [(i, j) for i in range(nq) for j in range(i + 1)]
    i_idx, j_idx = np.asarray(pairs, dtype=np.int32).T
    return i_idx, j_idx


def _slice(x, n, block, axis=1):
    return jax.lax.dynamic_slice_in_dim(x, n * block, block, axis=axis)


def _scores(qb, kb, i, j, block, scale, seg=None):
    """Masked scores of query block ``i`` against key block ``j``: [B, K, G, blk, blk] float32.
    Only a diagonal block (j == i) has masked entries; masking every block keeps one code path."""
    s = jnp.einsum("bskgd,btkd->bkgst", qb, kb).astype(jnp.float32) * scale
    # The block indices pass a barrier with one element of the query block.  Otherwise the mask
    # depends on nothing the step is differentiated for, and JAX's partial evaluation of a
    # rematerialised layer computes it ahead of the scan for every block pair, broadcast to the
    # scores' shape: a [pairs, B, K, G, blk, blk] boolean stack kept through the step
    # (tests/test_attention.py).  Tied to the data, each block's mask is made where it is used.
    i, j, _ = jax.lax.optimization_barrier((i, j, qb[:1, :1, :1, :1, :1]))
    q_pos = i * block + jnp.arange(qb.shape[1])[:, None]
    k_pos = j * block + jnp.arange(block)[None, :]
    mask = k_pos <= q_pos
    if seg is not None:  # the whole [B, S] segment ids: the blocks' own are sliced here
        seg_q = jax.lax.dynamic_slice_in_dim(seg, i * block, qb.shape[1], axis=1)
        seg_k = jax.lax.dynamic_slice_in_dim(seg, j * block, block, axis=1)
        mask = mask[None, None, None] & _same_segment(seg_q, seg_k)[:, None, None]
    return jnp.where(mask, s, _NEG)


def _check_self_attention(q, k):
    # Query block i and key block i cover the same positions only when S == T; the pair list
    # (and the diagonal as the last visible key block) rests on that.
    if q.shape[1] != k.shape[1]:
        raise ValueError(
            f"blockwise attention is causal self-attention: queries and keys need one length, "
            f"got S={q.shape[1]} and T={k.shape[1]}"
        )


def _forward(q, k, v, block, unroll=False, seg=None, lanes=0):
    """(out [B,S,K,G,dv], lse [B,K,G,S]): one scan over the visible (query block, key block)
    pairs, query-block-major, with the running max, sum and output of the current query block.

    ``lanes`` > 0: lse is written as [B,K,G,S,lanes], each value repeated across the lanes, as the
    splash kernel writes its log-sum-exp (:data:`SPLASH_LSE_LANES`)."""
    B, S, K, G, _ = q.shape
    dv = v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    i_idx, j_idx = _pairs(S // block, by_key=False)
    blk_shape = (B, K, G, block)

    def body(carry, ij):
        m, lsum, acc, out, lse = carry
        i, j = ij
        first = j == 0  # a new query block: its running statistics start over
        m = jnp.where(first, _NEG, m)
        lsum = jnp.where(first, 0.0, lsum)
        acc = jnp.where(first, 0.0, acc)
        s = _scores(_slice(q, i, block), _slice(k, j, block), i, j, block, scale, seg)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        lsum = lsum * corr + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bkgst,btkv->bkgsv", p.astype(v.dtype), _slice(v, j, block))
        acc = acc * corr[..., None] + pv.astype(jnp.float32)
        # Written at every pair rather than selected at j == i (no select over the whole
        # buffer): the query block's last pair, j == i, writes the final value.
        o = jnp.moveaxis(acc / lsum[..., None], 3, 1).astype(v.dtype)  # [B,blk,K,G,dv]
        out = jax.lax.dynamic_update_slice_in_dim(out, o, i * block, axis=1)
        lse_i = m_new + jnp.log(lsum)
        if lanes:
            lse_i = jnp.broadcast_to(lse_i[..., None], (*lse_i.shape, lanes))
        lse = jax.lax.dynamic_update_slice_in_dim(lse, lse_i, i * block, axis=3)
        return (m_new, lsum, acc, out, lse), None

    init = (
        jnp.full(blk_shape, _NEG, jnp.float32),
        jnp.zeros(blk_shape, jnp.float32),
        jnp.zeros((*blk_shape, dv), jnp.float32),
        jnp.zeros((B, S, K, G, dv), v.dtype),
        jnp.zeros((B, K, G, S, lanes) if lanes else (B, K, G, S), jnp.float32),
    )
    (*_, out, lse), _ = jax.lax.scan(body, init, (i_idx, j_idx), unroll=unroll)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _blockwise(q, k, v, seg, block, unroll, lanes=0):
    return _forward(q, k, v, block, unroll, seg, lanes)[0]


def _blockwise_fwd(q, k, v, seg, block, unroll, lanes=0):
    out, lse = _forward(q, k, v, block, unroll, seg, lanes)
    # The residual is one lane of it (the kernel's wrapper slices it so): a consumer reads the
    # lane-wide buffer it is sliced from.
    return out, (q, k, v, seg, out, lse[..., 0] if lanes else lse)


def _blockwise_bwd(block, unroll, lanes, res, d_out):
    """One scan over the visible pairs, key-block-major: the current key block's dk, dv are
    local to the carry, dq is accumulated in place; one [B, K, G, blk, blk] block at a time."""
    q, k, v, seg, out, lse = res
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    do = d_out.astype(jnp.float32)  # [B,S,K,G,dv]
    delta = jnp.sum(do * out.astype(jnp.float32), axis=-1)  # [B,S,K,G]
    nq = q.shape[1] // block
    i_idx, j_idx = _pairs(nq, by_key=True)
    kb_shape, vb_shape = (k.shape[0], block, *k.shape[2:]), (v.shape[0], block, *v.shape[2:])

    def body(carry, ij):
        dq, dk_b, dv_b, dk, dv = carry
        i, j = ij
        first = i == j  # a new key block: its gradients start over
        dk_b = jnp.where(first, 0.0, dk_b)
        dv_b = jnp.where(first, 0.0, dv_b)
        qb, kb = _slice(q, i, block), _slice(k, j, block)
        lse_i = _slice(lse, i, block, axis=3)  # [B,K,G,blk]
        p = jnp.exp(_scores(qb, kb, i, j, block, scale, seg) - lse_i[..., None])  # [B,K,G,blk,blk]
        dob_t = jnp.moveaxis(_slice(do, i, block), 1, 3)  # [B,K,G,blk,dv]
        dv_b = dv_b + jnp.einsum("bkgst,bkgsv->btkv", p, dob_t)
        dp = jnp.einsum("bkgsv,btkv->bkgst", dob_t, _slice(v, j, block).astype(jnp.float32))
        ds = p * (dp - jnp.moveaxis(_slice(delta, i, block), 1, 3)[..., None]) * scale
        dq_i = jnp.einsum("bkgst,btkd->bskgd", ds, kb.astype(jnp.float32))
        dq = jax.lax.dynamic_update_slice_in_dim(dq, _slice(dq, i, block) + dq_i, i * block, axis=1)
        dk_b = dk_b + jnp.einsum("bkgst,bskgd->btkd", ds, qb.astype(jnp.float32))
        # Written at every pair; the key block's last pair, i == nq - 1, writes the final value.
        dk = jax.lax.dynamic_update_slice_in_dim(dk, dk_b, j * block, axis=1)
        dv = jax.lax.dynamic_update_slice_in_dim(dv, dv_b, j * block, axis=1)
        return (dq, dk_b, dv_b, dk, dv), None

    init = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.zeros(kb_shape, jnp.float32),
        jnp.zeros(vb_shape, jnp.float32),
        jnp.zeros(k.shape, jnp.float32),
        jnp.zeros(v.shape, jnp.float32),
    )
    (dq, _, _, dk, dv), _ = jax.lax.scan(body, init, (i_idx, j_idx), unroll=unroll)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def padded_value_attention(attend, q, k, v):
    """``attend(q, k, v_padded)[..., :dv]`` with v zero-padded on its head dim to q's.

    Exact: the padded columns of v only produce padded output columns (each output column is
    P times one column of v), which are sliced away; the softmax and scale depend on q and k
    alone.
    """
    d, dv = q.shape[-1], v.shape[-1]
    if dv > d:
        raise ValueError(f"value head dim {dv} exceeds the query/key head dim {d}")
    if dv == d:
        return attend(q, k, v)
    v_pad = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, d - dv)])
    return attend(q, k, v_pad)[..., :dv]


def _cudnn(q, k, v):
    """cuDNN's causal flash attention on [B,S,K,G,d] queries (G query heads per kv head)."""
    B, S, K, G, d = q.shape
    # jax.nn.dot_product_attention's grouped-query layout: query head n uses kv head n // G,
    # i.e. heads ordered (k, g) — the order of q's K and G axes.
    out = jax.nn.dot_product_attention(
        q.reshape(B, S, K * G, d), k, v, is_causal=True, implementation="cudnn"
    )
    return out.reshape(B, S, K, G, v.shape[-1])


def splash_block(seq: int) -> int:
    """Splash attention's block size for a sequence of ``seq`` tokens.

    Raises:
      TieraxError: ``seq`` is not a multiple of 128 (the kernel's lane width).
    """
    for b in SPLASH_BLOCKS:
        if seq % b == 0:
            return b
    raise TieraxError(
        f"attention=splash needs a sequence length that is a multiple of 128 (got {seq}); "
        "use a multiple of 128 or attention=blockwise"
    )


def _splash_local(q, k, v, seg, *, interpret: bool):
    """The kernel on one device's shard: q [B,S,K,G,d], k [B,S,K,d], v [B,S,K,dv] (dv == d)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    B, S, K, G, d = q.shape
    H = K * G
    b = splash_block(S)
    sizes = sk.BlockSizes(
        block_q=b,
        block_kv=b,
        block_kv_compute=b,
        block_q_dkv=b,
        block_kv_dkv=b,
        block_kv_dkv_compute=b,
        block_q_dq=b,
        block_kv_dq=b,
    )
    mask = sm.MultiHeadMask([sm.CausalMask((S, S)) for _ in range(H)])
    kernel = sk.make_splash_mha(
        mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    # The kernel does not scale the scores: q is scaled by 1/sqrt(d) first, as in xla_attention.
    q_BHSd = jnp.transpose(q.reshape(B, S, H, d) * (1.0 / math.sqrt(d)), (0, 2, 1, 3))
    k_BKSd = jnp.transpose(k, (0, 2, 1, 3))
    v_BKSv = jnp.transpose(v, (0, 2, 1, 3))
    if seg is None:
        o_BHSv = jax.vmap(kernel)(q_BHSd.astype(q.dtype), k_BKSd, v_BKSv)
    else:
        o_BHSv = jax.vmap(
            lambda qq, kk, vv, ss: kernel(qq, kk, vv, segment_ids=sk.SegmentIds(ss, ss))
        )(q_BHSd.astype(q.dtype), k_BKSd, v_BKSv, seg)
    return jnp.transpose(o_BHSv, (0, 2, 1, 3)).reshape(B, S, K, G, v.shape[-1])


def splash_attention(q, k, v, segment_ids=None, *, mesh=None, interpret: bool = False):
    """Causal splash attention (the Pallas TPU kernel) on [B,S,K,G,d] queries; v's head dim is
    zero-padded to q's where smaller (MLA).  On a ``mesh`` of more than one device the kernel runs
    per shard under ``shard_map``: batch over the batch axes, kv heads over ``tensor``.

    Raises:
      TieraxError: a sequence that is not a multiple of 128, or kv heads not divisible by
        ``tensor``.
    """
    _check_self_attention(q, k)
    splash_block(q.shape[1])

    def local(q, k, v, seg=None):
        return padded_value_attention(
            lambda a, b, c: _splash_local(a, b, c, seg, interpret=interpret), q, k, v
        )

    if mesh is None or mesh.size == 1:
        return local(q, k, v, segment_ids)
    from tierax.mesh import BATCH_AXES, spec

    tensor = mesh.shape.get("tensor", 1)
    if q.shape[2] % tensor:
        raise TieraxError(
            f"attention=splash shards kv heads over tensor: {q.shape[2]} kv heads do not divide "
            f"over tensor={tensor}; use a tensor size that divides them or attention=blockwise"
        )
    q_spec = spec(mesh, BATCH_AXES, None, "tensor", None, None)
    kv_spec = spec(mesh, BATCH_AXES, None, "tensor", None)
    args, specs = (q, k, v), (q_spec, kv_spec, kv_spec)
    if segment_ids is not None:
        args, specs = (*args, segment_ids), (*specs, spec(mesh, BATCH_AXES, None))
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=q_spec, check_vma=False)(*args)


def _fused_stand_in(q, k, v, *, block, segment_ids=None, lse_lanes=0):
    # The scope marks the kernel's extent: tierax.tracing.hbm counts what runs inside it as one
    # fused kernel (whose own traffic its measured rate already includes), and
    # tierax.tracing.jaxpr_tools counts its
    # matmuls apart, so the cost model can price them at the fused kernel's rate.
    with jax.named_scope(FUSED_SCOPE):
        return _blockwise_attention(q, k, v, segment_ids, block, False, lse_lanes)


def causal_attention(
    q,
    k,
    v,
    *,
    impl: str = "xla",
    block: int = 512,
    unroll: bool = False,
    segment_ids=None,
    mesh=None,
):
    """Causal attention; ``impl`` is ``xla``, ``blockwise`` (block size ``block`` keys),
    ``cudnn`` (fused, CUDA only), ``cudnn_blockwise`` (the cuDNN route in XLA form), ``splash``
    (the Pallas TPU kernel, per shard of ``mesh``) or ``splash_blockwise`` (its XLA form).

    ``unroll`` (blockwise only) unrolls its scans: the same computation, for analysis — XLA's
    ``cost_analysis`` counts a loop body once whatever its trip count, so FLOPs are only
    comparable with the loops unrolled.

    ``segment_ids``: int [B, S] document ids of a packed batch (None: one document per row);
    a query then sees only earlier keys of its own document.  An implementation that cannot
    apply them (``cudnn``) refuses them: ignoring them would let packed documents attend to
    each other silently."""
    if impl == "xla":
        return xla_attention(q, k, v, segment_ids)
    if impl == "auto":
        raise ValueError(
            "attention=auto is chosen per platform before tracing "
            "(tierax.models.for_platform); this trace got it unresolved"
        )
    if impl == "cudnn" and segment_ids is not None:
        raise ValueError(
            "attention=cudnn cannot mask packed documents (JAX's cuDNN entry takes no segment "
            "ids); use attention=blockwise with document masking"
        )
    if impl == "cudnn":
        return padded_value_attention(_cudnn, q, k, v)
    if impl == "cudnn_blockwise":
        # 128-key blocks whatever ``block`` says: with causal block skipping the stand-in's matmul
        # work is then the causal triangle plus its 128-wide diagonal blocks, as a tiled kernel's
        # is.
        return padded_value_attention(
            functools.partial(_fused_stand_in, block=FUSED_TILE, segment_ids=segment_ids), q, k, v
        )
    if impl == "splash":
        return splash_attention(q, k, v, segment_ids, mesh=mesh)
    if impl == "splash_blockwise":
        _check_self_attention(q, k)
        return padded_value_attention(
            functools.partial(
                _fused_stand_in,
                block=splash_block(q.shape[1]),
                segment_ids=segment_ids,
                lse_lanes=SPLASH_LSE_LANES,
            ),
            q,
            k,
            v,
        )
    if impl != "blockwise":
        raise ValueError(f"unknown attention implementation {impl!r}")
    return _blockwise_attention(q, k, v, segment_ids, block, unroll)


def _blockwise_attention(q, k, v, segment_ids, block, unroll, lse_lanes=0):
    _check_self_attention(q, k)
    T = k.shape[1]
    block = min(block, T)
    while T % block:  # the largest block ≤ requested that divides the sequence
        block -= 1
    return _blockwise(q, k, v, segment_ids, block, unroll, lse_lanes)
