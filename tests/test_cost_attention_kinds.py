"""``attention=cudnn_blockwise`` is priced as what it compiles to: plain XLA blockwise attention
(no cuDNN call in the deviceless GPU compile), not the fused cuDNN kernel it stands in for."""

import dataclasses
import json

import pytest

from tierax import costmodel as cm
from tierax import plan as plan_lib
from tierax.hardware import cudnn
from tierax.models import get_config
from tierax.tracing.inventory import model_inventory
from tierax.tracing.model_program import for_inventory
from tierax.xla import compile as C


def _predict(cfg, microbatch=2, seq=256):
    rates = cm.target_rates("h200", cfg.dtype)
    plan = plan_lib.preset("save-all", cfg)
    return cm.simulate(
        plan, for_inventory(cfg, model_inventory(cfg, microbatch, seq)), rates, "lhs"
    )


def test_cudnn_blockwise_is_priced_as_blockwise_attention_in_128_key_blocks():
    base = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16", head_dim=64)
    standin = _predict(dataclasses.replace(base, attention="cudnn_blockwise"))
    # The same XLA code through the other route: blockwise attention, 128 keys a block (the stand-
    # in's tile), value head dim = query head dim so nothing is padded.
    plain = _predict(dataclasses.replace(base, attention="blockwise", attention_block=128))
    fused = _predict(dataclasses.replace(base, attention="cudnn"))
    assert standin.breakdown.fused_attention_s == 0.0
    assert standin.step_time_s == pytest.approx(plain.step_time_s, rel=1e-12)
    assert standin.peak_device_bytes == plain.peak_device_bytes
    # the fused kernel (no score-block traffic, its own rates) is priced differently
    assert fused.breakdown.fused_attention_s > 0 and fused.step_time_s < standin.step_time_s


def test_mla_cudnn_blockwise_runs_no_matmul_at_the_fused_rate():
    cfg = dataclasses.replace(
        get_config("tiny-deepseek"), dtype="bfloat16", attention="cudnn_blockwise"
    )
    inv = model_inventory(cfg, 2, 64)
    assert all(g.fused_attention_flops_per_layer == 0 for g in inv.groups)
    assert _predict(cfg, seq=64).breakdown.fused_attention_s == 0.0


@pytest.mark.slow  # a deviceless GPU compile
def test_cudnn_blockwise_compiles_to_no_cudnn_call():
    cfg = dataclasses.replace(
        get_config("tiny-llama"), dtype="bfloat16", attention="cudnn_blockwise"
    )
    result, text = C.compile_for_target(
        cfg, plan_lib.preset("remat-full", cfg), "h200", microbatch=2, seq=128
    )
    assert result.cudnn_calls == 0 and sum(cudnn.custom_calls(text).values()) == 0


def test_cudnn_blockwise_on_a_tpu_target_is_the_xla_code_it_runs(cli):
    # It compiles to XLA code, which XLA:TPU runs: priced as blockwise attention, not refused as
    # if it were the cuDNN kernel.
    args = ["simulate", "--target", "v5e", "--set", "dtype=bfloat16", "--json"]
    r = cli(*args, "--set", "attention=cudnn_blockwise")
    assert r.returncode == 0, r.stderr
    plain = cli(*args, "--set", "attention=blockwise", "--set", "attention_block=128")
    assert json.loads(r.stdout) == json.loads(plain.stdout)
    fused = cli(*args, "--set", "attention=cudnn")
    assert fused.returncode == 2 and "attention=cudnn" in fused.stderr
