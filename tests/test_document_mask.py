"""Document masking: packed documents attend only within themselves, positions restart per
document, and the loss counts only targets inside their input's document; a packed batch then
gives each document the loss and gradients it has when run on its own (padded)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tierax import plan as plan_lib
from tierax.models import get_config
from tierax.models.attention import causal_attention
from tierax.models.documents import document_mask, target_weights
from tierax.models.layers import rope
from tierax.train import step as S

# Two packed rows of 33 tokens (seq 32 + the shifted target) and their documents' lengths.
ROWS = [[10, 15, 8], [20, 13]]
PAD = 1000


def _segments(rows, length):
    out = np.zeros((len(rows), length), np.int32)
    for r, lens in enumerate(rows):
        out[r] = np.repeat(np.arange(len(lens)), lens)
    return out


@pytest.mark.parametrize(
    "impl, groups",
    [
        ("xla", 1),
        pytest.param("xla", 2, marks=pytest.mark.slow),
        pytest.param("blockwise", 1, marks=pytest.mark.slow),
        ("blockwise", 2),
    ],
)
def test_attention_within_segments_equals_each_document_alone(impl, groups):
    B, T, K, d = 2, 33 - 1, 2, 16
    rows = [[9, 15, 8], [20, 12]]
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    rng = np.random.default_rng(0)
    q, k, v, ct = (
        jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
        for shape in ((B, T, K, groups, d), (B, T, K, d), (B, T, K, d), (B, T, K, groups, d))
    )
    seg = jnp.asarray(_segments(rows, T))

    def packed(q, k, v):
        return jnp.sum(causal_attention(q, k, v, impl=impl, block=8, segment_ids=seg) * ct)

    def alone(q, k, v):
        total = 0.0
        for r, lens in enumerate(rows):
            at = 0
            for n in lens:
                s = slice(at, at + n)
                out = causal_attention(
                    q[r : r + 1, s], k[r : r + 1, s], v[r : r + 1, s], impl="xla"
                )
                total = total + jnp.sum(out * ct[r : r + 1, s])
                at += n
        return total

    out = causal_attention(q, k, v, impl=impl, block=8, segment_ids=seg)
    at = 0
    for n in rows[0]:
        ref = causal_attention(
            q[:1, at : at + n], k[:1, at : at + n], v[:1, at : at + n], impl="xla"
        )
        np.testing.assert_allclose(out[:1, at : at + n], ref, rtol=1e-5, atol=1e-5)
        at += n
    grads = [jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v) for f in (packed, alone)]
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # Without the segments a later document sees the earlier ones: the same check fails.
    plain = causal_attention(q, k, v, impl=impl, block=8)
    assert not np.allclose(plain[:1, 9:24], out[:1, 9:24], atol=1e-3)


def test_positions_restart_at_each_document():
    seg = jnp.asarray(_segments(ROWS, 33))
    mask = document_mask(seg)
    expected = [np.concatenate([np.arange(n) for n in lens]) for lens in ROWS]
    np.testing.assert_array_equal(mask.positions, np.stack(expected))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 33, 3, 8), dtype=np.float32))
    rotated = rope(x, 10000.0, mask.positions)
    # The third document of row 0 (tokens 25..32) is rotated as if it stood alone at position 0.
    np.testing.assert_allclose(rotated[:1, 25:], rope(x[:1, 25:], 10000.0), rtol=1e-6, atol=1e-6)
    assert not np.allclose(rope(x, 10000.0)[:1, 25:], rotated[:1, 25:])
    # A window that starts inside a document: its piece counts from 0 (the rest is not in it).
    np.testing.assert_array_equal(
        document_mask(jnp.asarray([[0, 0, 1, 1, 1]])).positions, [[0, 1, 0, 1, 2]]
    )


def test_loss_counts_only_targets_inside_their_document():
    seg = jnp.asarray([[0, 0, 0, 1, 1, 2]])
    np.testing.assert_array_equal(target_weights(seg), [[1, 1, 0, 1, 0]])


def _model(name, impl):
    cfg = dataclasses.replace(get_config(name), attention=impl, attention_block=8)
    if hasattr(
        cfg, "capacity_factor"
    ):  # capacity for every token: routing cannot depend on the packing
        cfg = dataclasses.replace(cfg, capacity_factor=cfg.num_experts / cfg.num_experts_per_tok)
    return cfg


def _packed_and_alone(vocab):
    """The packed rows and each document alone at the start of a row, both [5, 33]: rows after the
    packed ones, and the tail of each alone row, are padding (token 0), each pad token a segment of
    its own (from PAD on), so it neither sees nor predicts anything counted (one shape).
    """
    rng = np.random.default_rng(0)
    docs = [[rng.integers(1, vocab, n) for n in lens] for lens in ROWS]
    flat = [d for r in docs for d in r]
    pad_seg = np.broadcast_to(PAD + np.arange(33, dtype=np.int32), (len(flat), 33))
    packed, packed_seg = np.zeros((len(flat), 33), np.int32), pad_seg.copy()
    packed[: len(ROWS)] = [np.concatenate(r) for r in docs]
    packed_seg[: len(ROWS)] = _segments(ROWS, 33)
    alone, alone_seg = np.zeros((len(flat), 33), np.int32), pad_seg.copy()
    for i, d in enumerate(flat):
        alone[i, : len(d)] = d
        alone_seg[i, : len(d)] = 0
    return packed, packed_seg, alone, alone_seg


def _per_document_nll(token_nll, params, tokens, seg, *, mask=True):
    """Each document's summed next-token NLL (targets inside it), in document order; ``mask``:
    the model sees the segment ids (else it attends across documents)."""
    nll = np.asarray(token_nll(params, tokens, seg[:, :-1] if mask else None))
    same = seg[:, :-1] == seg[:, 1:]
    out = []
    for r in range(tokens.shape[0]):
        for s in np.unique(seg[r])[np.unique(seg[r]) < PAD]:
            sel = (seg[r, :-1] == s) & same[r]
            if sel.any():
                out.append(float(np.sum(nll[r][sel])))
    return out


@pytest.mark.parametrize(
    "name, impl, plan",
    [
        ("tiny-llama", "xla", "save-all"),
        pytest.param("tiny-llama", "blockwise", "qkv-offload", marks=pytest.mark.slow),
        # the MoE model's packed step: half a minute of compiles here
        pytest.param("tiny-deepseek", "blockwise", "deepseek-offload", marks=pytest.mark.slow),
    ],
)
def test_packed_batch_equals_documents_run_separately(name, impl, plan):
    """Per-document loss and the gradients of the mean loss, packed vs alone, for each attention
    kind (and prefetching plans, whose scans close over the segment ids)."""
    cfg = _model(name, impl)
    graphdef, params = S.init_params(cfg, seed=3)
    packed, seg, alone, alone_seg = _packed_and_alone(cfg.vocab_size)

    @jax.jit
    def token_nll(params, tokens, seg):
        logits = nnx.merge(graphdef, params)(tokens[:, :-1], segment_ids=seg)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, 1:, None], -1)[..., 0]

    per_packed = _per_document_nll(token_nll, params, packed, seg)
    per_alone = _per_document_nll(token_nll, params, alone, alone_seg)
    assert len(per_packed) == len(per_alone) == 5
    np.testing.assert_allclose(per_packed, per_alone, rtol=2e-5)

    grad = jax.jit(
        jax.value_and_grad(
            S.make_loss_fn(graphdef, plan_lib.to_policies(plan_lib.preset(plan, cfg), cfg))
        )
    )
    lp, gp = grad(params, jnp.asarray(packed), jnp.asarray(seg))
    la, ga = grad(params, jnp.asarray(alone), jnp.asarray(alone_seg))
    assert abs(float(lp) - float(la)) <= 2e-5 * abs(float(la))
    assert float(lp) == pytest.approx(
        sum(per_packed) / sum(n - 1 for r in ROWS for n in r), rel=2e-5
    )
    for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(ga), strict=True):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-4 * float(jnp.max(jnp.abs(b))) + 1e-7
    if (
        impl == "xla"
    ):  # unmasked, the later documents of a row see the earlier ones: their losses change
        per_plain = _per_document_nll(token_nll, params, packed, seg, mask=False)
        assert per_plain[0] == pytest.approx(
            per_packed[0], rel=2e-5
        )  # a row's first document: unchanged
        assert not np.allclose(per_plain[1:3], per_packed[1:3], rtol=1e-3)
