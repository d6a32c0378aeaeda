"""``attention: auto`` — the full-size configs' attention, chosen per platform before tracing:
cuDNN's fused flash attention for a GPU target (what GPU training runs), splash attention for a
TPU target, blockwise elsewhere."""

import dataclasses
import json

import pytest

from tierax import launch
from tierax.errors import TieraxError
from tierax.models import NAMED_CONFIGS, for_platform, get_config
from tierax.tracing.inventory import model_inventory

FULL_SIZE = ("llama3-8b", "llama3.1-405b", "deepseek-v3-671b")


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_configs_run_fused_attention_on_a_gpu_and_blockwise_elsewhere(name):
    cfg = get_config(name)
    assert cfg.attention == "auto"
    assert for_platform(cfg, "gpu").attention == "cudnn"
    assert for_platform(cfg, "tpu").attention == "splash"  # the Pallas TPU kernel
    assert for_platform(cfg, "cpu").attention == "blockwise"


def test_small_configs_keep_their_own_attention():
    for name in ("tiny-llama", "tiny-deepseek"):
        cfg = get_config(name)
        assert cfg.attention != "auto"
        assert for_platform(cfg, "gpu") is cfg


def test_auto_chooses_blockwise_on_a_gpu_where_cudnn_cannot_run():
    cfg = get_config("llama3-8b")
    # 32-bit compute: cuDNN's flash attention needs 16-bit.
    assert for_platform(dataclasses.replace(cfg, dtype="float32"), "gpu").attention == "blockwise"
    # A q/k head dim above 256.
    wide = dataclasses.replace(cfg, head_dim=320)
    assert for_platform(wide, "gpu").attention == "blockwise"
    # Packed documents: JAX's cuDNN entry takes no segment ids.
    assert for_platform(cfg, "gpu", documents=True).attention == "blockwise"


def test_an_explicit_attention_is_never_replaced():
    cfg = dataclasses.replace(get_config("llama3-8b"), attention="xla")
    assert for_platform(cfg, "gpu").attention == "xla"


def test_unknown_platform_and_unresolved_auto_are_refused_with_the_fix():
    with pytest.raises(TieraxError, match="unknown platform 'metal'.*gpu, tpu, cpu"):
        for_platform(get_config("llama3-8b"), "metal")
    with pytest.raises(TieraxError, match="attention=auto.*for_platform.*attention=blockwise"):
        model_inventory(get_config("llama3-8b"), 1, 256)


def test_the_local_cpu_backend_resolves_auto_to_blockwise():
    cfg = launch.local_attention(NAMED_CONFIGS["llama3-8b"], what="test")
    assert cfg.attention == "blockwise"


def _fused_flops(cli, target: str) -> list[float]:
    r = cli(
        *[
            "inventory",
            "--model",
            "llama3-8b",
            "--set",
            "num_layers=2",
            "--target",
            target,
            "--microbatch",
            "1",
            "--seq",
            "256",
            "--json",
        ]
    )
    assert r.returncode == 0, r.stderr
    return [g["fused_attention_flops_per_layer"] for g in json.loads(r.stdout)["groups"]]


def test_the_cli_prices_fused_attention_for_gpu_and_tpu_targets(cli):
    """The inventory traced for an H200 counts the fused kernel's matmuls apart, and for a TPU
    target splash attention's at its own block (256 keys at 256 tokens: one block pair)."""
    gpu = _fused_flops(cli, "h200")
    # Forward causal attention: QK^T and PV at 128-key tiles, with skipping: blocks on and below
    # the diagonal, (n(n+1)/2) of n = 2 tiles, 2 FLOPs per multiply-add, 32 heads of 128.
    tiles = 256 // 128
    pairs = tiles * (tiles + 1) // 2
    expected = 2 * 2 * 32 * 128 * 128 * 128 * pairs
    assert gpu == [pytest.approx(expected, rel=1e-6)]
    assert _fused_flops(cli, "v5p") == [pytest.approx(2 * 2 * 32 * 128 * 256 * 256, rel=1e-6)]


def test_emit_maxtext_writes_the_attention_the_target_runs(cli):
    def attention_key(target):
        r = cli(
            *[
                "plans",
                "--show",
                "remat-full",
                "--model",
                "llama3-8b",
                "--emit",
                "maxtext",
                "--target",
                target,
                "--devices",
                "8",
                "--mesh",
                "fsdp=8",
            ]
        )
        assert r.returncode == 0, r.stderr
        return [ln for ln in r.stdout.splitlines() if ln.startswith("attention:")]

    assert attention_key("h200") == ["attention: cudnn_flash_jax"]
    assert attention_key("v5p") == ["attention: flash"]  # MaxText's flash on a TPU is splash
