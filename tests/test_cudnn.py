"""cuDNN flash attention: the padded-value route for MLA head dims, its host-traceable stand-in,
and the deviceless CUDA compile (custom calls, the target's head-dim limit, the workspace)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.hardware import cudnn
from tierax.models import get_config
from tierax.models.attention import (
    FUSED_SCOPE,
    FUSED_TILE,
    causal_attention,
    padded_value_attention,
    xla_attention,
)
from tierax.tracing import hbm, jaxpr_tools
from tierax.xla import compile as C


def _qkv(d=24, dv=16, groups=1, seq=32):
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    rng = np.random.default_rng(3)
    q, k, v, ct = (
        jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
        for shape in (
            (2, seq, 2, groups, d),
            (2, seq, 2, d),
            (2, seq, 2, dv),
            (2, seq, 2, groups, dv),
        )
    )
    return q, k, v, ct


@pytest.mark.parametrize("impl", ["padded-xla", "cudnn_blockwise"])
@pytest.mark.parametrize("groups", [1, 3])
def test_padded_value_route_equals_unpadded_attention(impl, groups):
    # MLA: q/k head dim 24 (nope 16 + rope 8), v 16; the reference never pads.
    q, k, v, ct = _qkv(groups=groups)

    def attend(q, k, v):
        if impl == "padded-xla":
            return padded_value_attention(xla_attention, q, k, v)
        return causal_attention(q, k, v, impl=impl, block=8)

    out = attend(q, k, v)
    assert out.shape == (2, 32, 2, groups, 16)
    np.testing.assert_allclose(out, xla_attention(q, k, v), rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda *a: jnp.sum(attend(*a) * ct), argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(lambda *a: jnp.sum(xla_attention(*a) * ct), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_padded_route_saves_the_padded_value():
    # What the kernel keeps for its backward is the padded v: the residuals grow by d_qk / d_v.
    q, k, v, _ = _qkv(d=24, dv=16)
    res = jax.eval_shape(
        lambda *a: jax.vjp(lambda *b: causal_attention(*b, impl="cudnn_blockwise", block=8), *a)[1],
        q,
        k,
        v,
    )
    shapes = sorted(tuple(r.shape) for r in jax.tree.leaves(res))
    assert (2, 32, 2, 24) in shapes and (2, 32, 2, 16) not in shapes


def test_value_head_dim_above_query_is_refused():
    q, k, v, _ = _qkv(d=16, dv=24)
    with pytest.raises(ValueError, match="value head dim 24 exceeds"):
        padded_value_attention(xla_attention, q, k, v)


def test_fused_stand_in_is_one_kernel_for_hbm_and_counted_apart_for_flops():
    q, k, v, ct = _qkv()

    def vjp_of(impl, v, ct, block):
        def f(q, k, v):
            out, back = jax.vjp(lambda *a: causal_attention(*a, impl=impl, block=block), q, k, v)
            return out, back(ct)

        return jax.make_jaxpr(f)(q, k, v)

    fused, blockwise = vjp_of("cudnn_blockwise", v, ct, 8), vjp_of("blockwise", v, ct, 8)
    # The blockwise form moves score blocks through HBM; inside the fused kernel nothing is a
    # fusion, only the padding of v and the slice of the output run outside it.
    assert sum(hbm.phase_bytes(blockwise)) > 10 * sum(hbm.phase_bytes(fused))
    # Every matmul of the stand-in is inside the kernel's scope, and it is the blockwise form's work
    # on the padded value (P·V and its gradients at d_qk = 24 instead of d_v = 16) at the kernel's
    # tile, whatever block the caller asked for.
    total = jaxpr_tools.matmul_flops(fused)
    assert jaxpr_tools.matmul_flops(fused, scope=FUSED_SCOPE) == total
    v_pad = jnp.pad(v, [(0, 0)] * 3 + [(0, 8)])
    ct_pad = jnp.pad(ct, [(0, 0)] * 4 + [(0, 8)])
    padded = jaxpr_tools.matmul_flops(vjp_of("blockwise", v_pad, ct_pad, FUSED_TILE))
    unpadded = jaxpr_tools.matmul_flops(vjp_of("blockwise", v, ct, FUSED_TILE))
    assert total == padded > unpadded
    assert jaxpr_tools.matmul_flops(blockwise, scope=FUSED_SCOPE) == 0


def test_workspace_formula_equals_the_sizes_xla_reported():
    # Sizes XLA reported for the backward's workspace with cuDNN 9.26 in its
    # CUDNN_DEVICELESS_COMPILATION_ALWAYS mode (CUDA driver library present), B=1, S=4096, H=16:
    # q/k/v head dim 128, and q/k 192 with v 128 (JAX's internal MLA entry).
    assert cudnn.backward_workspace_bytes(1, 16, 4096, 128) == 33_816_832
    assert cudnn.backward_workspace_bytes(1, 16, 4096, 192) == 50_594_048


def test_target_capability_answers_for_the_target_and_restores():
    from jax._src.cudnn import fused_attention_stablehlo as fa

    before = fa.check_compute_capability("9.0")
    assert before is False  # a host default backend reads as pre-Hopper: why the context exists
    with cudnn.target_capability((9, 0)):
        assert fa.check_compute_capability("9.0") and not fa.check_compute_capability("10.0")
        assert fa.is_cuda_compute_capability_equal("9.0")
    with cudnn.target_capability((10, 0)):
        assert fa.check_compute_capability("10.0")
    assert fa.check_compute_capability("9.0") is False


def test_cudnn_needs_16_bit_compute():
    with pytest.raises(TieraxError, match="bfloat16 or float16"):
        dataclasses.replace(get_config("tiny-llama"), attention="cudnn")


def test_cudnn_is_refused_for_a_tpu_target_before_compiling():
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16", attention="cudnn")
    with pytest.raises(TieraxError, match="CUDA GPUs only.*attention=blockwise"):
        C.compile_for_target(cfg, plan_lib.preset("remat-full", cfg), "v5e", microbatch=1, seq=64)


def _mla_192():
    # DeepSeek-V3's attention head dims (q/k 128 + 64, v 128) at a tiny width.
    return dataclasses.replace(
        get_config("tiny-deepseek"),
        dtype="bfloat16",
        attention="cudnn",
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_heads=2,
    )


@pytest.mark.parametrize(
    "name, plan, target",
    [
        ("tiny-llama", "qkv-offload", "h200"),
        pytest.param("mla-192", "remat-full", "gb200", marks=pytest.mark.slow),  # MLA head dims
    ],
)
def test_deviceless_compile_holds_cudnn_attention(name, plan, target):
    cfg = (
        _mla_192()
        if name == "mla-192"
        else dataclasses.replace(get_config(name), dtype="bfloat16", attention="cudnn")
    )
    result, text = C.compile_for_target(
        cfg, plan_lib.preset(plan, cfg), target, microbatch=2, seq=128
    )
    calls = cudnn.custom_calls(text)
    # One backward kernel per layer's backward (inside the scanned backward loop: one call per
    # group), forwards in the forward loop and again where the layer is rematerialised.
    groups = len(cfg.layer_groups())
    assert calls["backward"] == groups and calls["forward"] >= groups
    assert result.cudnn_calls == calls["forward"] + calls["backward"]
    _, dqk, _ = cfg.attention_dims()
    assert result.cudnn_workspace_bytes == 4 * 2 * cfg.num_heads * 128 * (dqk + 1) + 256
    if plan == "qkv-offload":
        assert all(o.on_host for o in result.offloaded)


@pytest.mark.parametrize(
    "verb", [["bench", "--plans", "save-all", "--steps", "1"], ["verify", "--plan", "minimal"]]
)
def test_cudnn_on_the_cpu_backend_is_refused_before_any_work(verb, monkeypatch, capsys):
    from tierax import cli

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # JAX already started (conftest)
    code = cli.main(
        [
            verb[0],
            "--model",
            "tiny-llama",
            "--set",
            "dtype=bfloat16",
            "--set",
            "attention=cudnn",
            *verb[1:],
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "CUDA GPUs only" in err and "cpu" in err and "blockwise" in err


def test_cudnn_refuses_packed_documents_and_the_stand_in_masks_them():
    q, k, v, ct = _qkv()
    seg = jnp.asarray([[0] * 12 + [1] * 20, [0] * 32])
    with pytest.raises(ValueError, match="cannot mask packed documents"):
        causal_attention(q, k, v, impl="cudnn", segment_ids=seg)
    # The stand-in (what the inventory traces) masks them as blockwise and xla do.
    got = causal_attention(q, k, v, impl="cudnn_blockwise", segment_ids=seg)
    np.testing.assert_allclose(got, xla_attention(q, k, v, seg), rtol=1e-5, atol=1e-5)


def test_a_train_config_with_document_masking_refuses_cudnn():
    import pathlib

    from tierax.train import config as TC

    demo = pathlib.Path(__file__).resolve().parents[1] / "configs" / "demo-train.yaml"
    base = ["model.dtype=bfloat16", "data.document_mask=true"]
    TC.load_train_config(
        demo, [*base, "model.attention=blockwise"]
    )  # masks packed documents: accepted
    with pytest.raises(TieraxError, match="document_mask.*attention=cudnn cannot"):
        TC.load_train_config(demo, [*base, "model.attention=cudnn"])
