"""``attention: auto``'s boundaries on a GPU, one step either side of each limit cuDNN's flash
attention states (16-bit compute; q/k head dim a multiple of 8, at most 256, not below the v head
dim)."""

import dataclasses

import pytest

from tierax.models import for_platform, get_config


@pytest.mark.parametrize(
    "changes, attention",
    [
        ({"head_dim": 256}, "cudnn"),  # the largest legal head dim
        ({"head_dim": 264}, "blockwise"),  # the next multiple of 8
        ({"head_dim": 248}, "cudnn"),
        ({"head_dim": 252}, "blockwise"),  # not a multiple of 8
        ({"head_dim": 8}, "cudnn"),
        ({"dtype": "float16"}, "cudnn"),
        ({"dtype": "float32"}, "blockwise"),
    ],
)
def test_llama_head_dim_and_dtype_boundaries(changes, attention):
    cfg = dataclasses.replace(get_config("llama3-8b"), **changes)
    assert for_platform(cfg, "gpu").attention == attention
    assert for_platform(cfg, "tpu").attention == "splash"  # TPU targets run the splash kernel


@pytest.mark.parametrize(
    "changes, attention",
    [
        ({}, "cudnn"),  # q/k 128 + 64 = 192, v 128
        ({"v_head_dim": 192}, "cudnn"),  # v equal to q/k: allowed
        ({"v_head_dim": 200}, "blockwise"),  # v above q/k
        ({"qk_rope_head_dim": 128}, "cudnn"),  # q/k 256
        ({"qk_rope_head_dim": 136}, "blockwise"),  # q/k 264
        ({"qk_rope_head_dim": 60}, "blockwise"),  # q/k 188: not a multiple of 8
    ],
)
def test_mla_head_dim_boundaries(changes, attention):
    cfg = dataclasses.replace(get_config("deepseek-v3-671b"), **changes)
    assert cfg.attention_dims()[1] == cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    assert for_platform(cfg, "gpu").attention == attention
