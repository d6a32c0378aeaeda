"""MaxText's loss on a TPU (:mod:`tierax.interop.maxtext_program.tpu_terms`): the Program's
``loss_bytes``, ``after_backward_bytes`` and ``late_grad_bytes`` counted by hand from a tiny
config's shapes on 4 v5p chips (fsdp 4) — the head's gradient made after the layers' backward (emb
> 2 × tokens) and at the loss (emb ≤ 2 × tokens), a tiled loss — the cost model's phases over them,
and (slow) the buffers XLA:TPU's compile of a small MaxText step holds beside the rules.
"""

from __future__ import annotations

import maxtext_cli as M
import pytest

from tierax.interop.maxtext_program.config import maxtext_importable

pytestmark = pytest.mark.skipif(
    not maxtext_importable(),
    reason="MaxText is not installed (make venv installs it on Python >= 3.12; make test requires "
    "it)",
)

# d 256, 4 query / 2 kv heads of 64, gated MLP 512, 2 layers, vocab 1024 (MaxText's llama2 block).
D, HEADS, KV, HD, MLP, LAYERS, VOCAB = 256, 4, 2, 64, 512, 2, 1024
TINY = [
    f"base_emb_dim={D}",
    f"base_num_query_heads={HEADS}",
    f"base_num_kv_heads={KV}",
    f"head_dim={HD}",
    f"base_mlp_dim={MLP}",
    f"base_num_decoder_layers={LAYERS}",
    f"vocab_size={VOCAB}",
    "remat_policy=full",
]
FSDP = 4
BF16, F32 = 2, 4
HEAD = D * VOCAB  # the head's [emb, vocab] elements


def _program(microbatch: int, seq: int, extra=()):
    from tierax.interop.maxtext_program import program

    return program(
        M.base_yml(),
        [*TINY, *extra],
        target="v5p",
        devices=FSDP,
        microbatch=microbatch,
        seq=seq,
    ).program


@pytest.fixture(scope="module")
def late():
    """32 tokens (emb 256 > 2 × 32): the head's gradient made after the layers' backward."""
    return _program(1, 32)


@pytest.fixture(scope="module")
def early():
    """256 tokens (emb 256 ≤ 2 × 256): the head's gradient made at the loss."""
    return _program(2, 128)


def _layer_params_per_device() -> int:
    """Per layer: q, k, v, out and the gated MLP's three kernels, sharded over fsdp; two norm
    scales, replicated."""
    sharded = D * HEADS * HD + 2 * D * KV * HD + HEADS * HD * D + 3 * D * MLP
    return LAYERS * (sharded // FSDP + 2 * D)


def _outside_params_per_device() -> int:
    """The embedding and the head, sharded over fsdp on emb; the final norm's scale, replicated."""
    return 2 * VOCAB * D // FSDP + D


def test_loss_with_the_head_gradient_after_the_layers(late):
    p = late
    assert p.mesh["fsdp"] == FSDP and p.head.tiles == 1
    tokens = 32
    # the head gathered in bf16, the logits and the buffer written from them in bf16
    assert p.loss_bytes == BF16 * HEAD + 2 * BF16 * tokens * VOCAB


def test_loss_with_the_head_gradient_at_the_loss(early):
    p = early
    tokens = 2 * 128
    # the gathered head, the logits, the head's unsharded gradient and its reduce-scattered shard
    want = BF16 * HEAD + BF16 * tokens * VOCAB + BF16 * HEAD + BF16 * HEAD // FSDP
    assert p.loss_bytes == want


def test_after_backward(late, early):
    for p in (late, early):
        inv = p.inventory
        assert inv.param_bytes == F32 * (_layer_params_per_device() + _outside_params_per_device())
    base = late.inventory.param_bytes + late.inventory.optimizer_bytes
    base += F32 * _layer_params_per_device()
    shard = BF16 * HEAD // FSDP
    # the head's bf16 gradient unsharded, the embedding's bf16 shard, and the larger of the logits'
    # buffer (2 × 32 × 1024 bytes) and the reduce-scatter's shard (here the shard)
    assert BF16 * 32 * VOCAB < shard
    assert late.after_backward_bytes == base + BF16 * HEAD + shard + shard
    # made at the loss: only the two shards after the layers
    assert early.after_backward_bytes == base + 2 * shard


def test_late_gradients(late, early):
    outside = F32 * _outside_params_per_device()
    # the embedding's and head's float32 gradients, less the held logits-sized buffer / head shard
    assert late.late_grad_bytes == outside - BF16 * 32 * VOCAB
    assert early.late_grad_bytes == outside - BF16 * HEAD // FSDP


def test_tiled_loss():
    p = _program(2, 128, ["num_vocab_tiling=2"])
    tokens = 2 * 128
    assert p.head.tiles == 2
    # one bf16 [emb, vocab], the float32 accumulator's shard, the bf16 head shard, a tile's bf16
    # logits
    want = BF16 * HEAD + (F32 + BF16) * HEAD // FSDP + BF16 * tokens // 2 * VOCAB
    assert p.loss_bytes == want
    assert p.after_backward_bytes == 0
    # the head's gradient is accumulated in the tile loop: only the embedding's (and the final
    # norm's) is late; the head's bf16 shard is held through the layers' backward
    assert p.late_grad_bytes == F32 * (VOCAB * D // FSDP + D) - BF16 * HEAD // FSDP


def test_cost_model_phases(late):
    """The cost model's TPU phases over the terms: the loss phase the parameters and optimizer
    state with the loss's bytes (no gradient yet), the layer phase the state less the late
    gradients (net of the held buffer), or the after-backward bytes."""
    from tierax.costmodel import rates as rates_lib
    from tierax.costmodel.fixed import fixed_terms

    p = late
    ft = fixed_terms(p, rates_lib.target_rates("v5p", "bfloat16"), "lhs")
    inv = p.inventory
    state = inv.param_bytes + inv.grad_bytes + inv.optimizer_bytes
    rest = ft.stack_copy_bytes + ft.fixed_device_bytes
    assert ft.loss_phase_bytes == inv.param_bytes + inv.optimizer_bytes + p.loss_bytes + rest
    layer = state - F32 * _outside_params_per_device() + BF16 * 32 * VOCAB
    assert ft.layer_phase_bytes == max(
        layer + ft.workspace_bytes + rest, p.after_backward_bytes + ft.fixed_device_bytes
    )
