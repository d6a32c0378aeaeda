"""Splash attention's stand-in (tierax.interop.maxtext_program.attention_standin): MaxText's layer
traced for a TPU target on this CPU for any head dims, MLA's value head dim and attention sinks.

Its residuals against a hand count from the shapes (q, k, v, the output, the log-sum-exp: what the
splash kernel's custom VJP keeps), its gradients' shapes and dtypes, MaxText's own gemma3 (head dim
256), deepseek2 (MLA, q/k 192, v 128) and gpt-oss (sinks) blocks traced with it, and its inventory
beside the cuDNN kernel's (the TPU stand-in before it) where both trace."""

from __future__ import annotations

import math
import pathlib

import maxtext_cli as M
import pytest

from tierax.errors import TieraxError

pytestmark = [M.requires_maxtext, M.programs_once]

BF16, F32 = "bfloat16", "float32"


def _sds(shape, dtype):
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _residuals(fn, *args) -> list[tuple[tuple, str]]:
    """(shape, dtype) of every value ``jax.vjp(fn)``'s backward keeps (as the inventory reads
    them: tierax.tracing.inventory), sorted."""
    import jax

    res = jax.eval_shape(lambda *a: jax.vjp(fn, *a)[1], *args)
    return sorted((tuple(r.shape), str(r.dtype)) for r in jax.tree.leaves(res))


# (B, S, query heads, kv heads, q/k head dim, v head dim, dtype, sinks)
KERNELS = {
    "gemma3-like head dim 256": (2, 128, 4, 2, 256, 256, BF16, False),
    "MLA q/k 192, v 128": (1, 256, 4, 4, 192, 128, BF16, False),
    "GQA with sinks": (2, 128, 8, 2, 64, 64, BF16, True),
    "float32": (1, 128, 2, 1, 64, 64, F32, False),
}


@pytest.mark.parametrize("case", KERNELS)
def test_residuals_by_hand(case):
    """The kernel keeps q, k, v as it takes them ([B, H, S, D]), the output [B, Hq, S, Dv] in q's
    dtype and the float32 log-sum-exp [B, Hq, S] (and the sinks), nothing else."""
    from tierax.interop.maxtext_program.attention_standin import splash_stand_in

    b, s, hq, hkv, dqk, dv, dtype, sinks = KERNELS[case]
    args = [
        _sds((b, s, hq, dqk), dtype),
        _sds((b, s, hkv, dqk), dtype),
        _sds((b, s, hkv, dv), dtype),
    ]
    want = [
        ((b, hq, s, dqk), dtype),  # q
        ((b, hkv, s, dqk), dtype),  # k
        ((b, hkv, s, dv), dtype),  # v
        ((b, hq, s, dv), dtype),  # the output
        ((b, hq, s), F32),  # the log-sum-exp
    ]
    if sinks:
        args.append(_sds((hq,), F32))
        want.append(((hq,), F32))
    assert _residuals(splash_stand_in, *args) == sorted(want)


@pytest.mark.parametrize("case", KERNELS)
def test_gradients_and_output_shapes(case):
    """dq, dk, dv (and the sinks' gradient) in the inputs' shapes and dtypes; the output in
    MaxText's [B, S, Hq, Dv] layout and q's dtype."""
    import jax
    import jax.numpy as jnp

    from tierax.interop.maxtext_program.attention_standin import splash_stand_in

    b, s, hq, hkv, dqk, dv, dtype, sinks = KERNELS[case]
    args = [_sds((b, s, hq, dqk), dtype), _sds((b, s, hkv, dqk), dtype)]
    args += [_sds((b, s, hkv, dv), dtype)] + ([_sds((hq,), F32)] if sinks else [])
    out = jax.eval_shape(splash_stand_in, *args)
    assert (out.shape, str(out.dtype)) == ((b, s, hq, dv), dtype)

    def loss(*a):
        return splash_stand_in(*a).astype(jnp.float32).sum()

    grads = jax.eval_shape(jax.grad(loss, argnums=tuple(range(len(args)))), *args)
    assert [(g.shape, g.dtype) for g in grads] == [(a.shape, a.dtype) for a in args]


def test_mismatched_shapes_refused():
    import jax

    from tierax.interop.maxtext_program.attention_standin import splash_stand_in

    q, k = _sds((1, 128, 4, 64), BF16), _sds((1, 128, 2, 128), BF16)
    with pytest.raises(TieraxError, match="share a head dim"):
        jax.eval_shape(splash_stand_in, q, k, k)
    with pytest.raises(TieraxError, match="do not group"):
        jax.eval_shape(splash_stand_in, q, _sds((1, 128, 3, 64), BF16), _sds((1, 128, 3, 64), BF16))
    with pytest.raises(TieraxError, match="one per query head"):
        kk = _sds((1, 128, 2, 64), BF16)
        jax.eval_shape(splash_stand_in, q, kk, kk, _sds((2,), F32))


# --- MaxText's layers ----------------------------------------------------------------------------


def _configs() -> pathlib.Path:
    import maxtext

    return pathlib.Path(maxtext.__file__).parent / "configs"


def _model_file(name: str) -> str:
    return str(_configs() / "models" / f"{name}.yml")


SEQ = 384  # no other dimension of the configs below: a [.., S, S] value would be a score matrix
CUT = ["override_model_config=true", "base_num_decoder_layers=2", "vocab_size=1024"]
# MaxText's model files, narrowed (the attention's head dims and kinds as the files ship them):
# (file, overrides, query heads, v head dim, attention layers per traced layer of each group)
MODELS = {
    "gemma3": (
        "gemma3-4b",
        ["base_emb_dim=256", "base_num_query_heads=2", "base_num_kv_heads=1", "base_mlp_dim=512"],
        2,
        256,
        {"layers_remainder": 2},  # 2 layers: the remainder block (local + global), applied once
    ),
    "deepseek2": (
        "deepseek2-16b",
        [
            "base_emb_dim=256",
            "base_num_query_heads=2",
            "base_num_kv_heads=2",
            "base_mlp_dim=512",
            "base_moe_mlp_dim=128",
            "num_experts=4",
            "num_experts_per_tok=2",
            "shared_experts=1",
            "kv_lora_rank=64",
        ],
        2,
        128,
        {"dense_layers": 1, "moe_layers": 1},
    ),
    "gpt-oss": (
        "gpt-oss-20b",
        [
            "base_emb_dim=256",
            "base_num_query_heads=4",
            "base_num_kv_heads=2",
            "base_mlp_dim=256",
            "base_moe_mlp_dim=256",
            "num_experts=4",
            "num_experts_per_tok=2",
        ],
        4,
        64,
        {"layers": 2},  # one scanned block: a sliding-window and a full layer, each with sinks
    ),
}


def _traced_residuals(key: str, extra=()) -> dict[str, list]:
    """{group: the (shape, dtype) of each value its layer's backward keeps, no remat}: MODELS[key]'s
    layers traced with attention=flash under the stand-in, as a TPU target traces them."""
    import jax
    from flax.linen import partitioning as nn_partitioning

    from tierax.interop import maxtext_program
    from tierax.interop.maxtext_program import trace

    name, keys, *_ = MODELS[key]
    out = {}
    with maxtext_program.load(
        _model_file(name), [*CUT, *keys, *extra, "attention=flash"], microbatch=1, seq=SEQ
    ) as loaded:
        config = loaded.config
        model = trace._abstract_model(config, trace._one_device_mesh(config))
        x = jax.ShapeDtypeStruct((1, SEQ, config.emb_dim), config.dtype)
        rules = nn_partitioning.axis_rules(config.logical_axis_rules)
        with rules, jax.numpy_rank_promotion("allow"), trace.attention_kernel(config):
            for group, stack in trace.decoder_stacks(model.decoder, config):
                fn, params, _ = trace._layer(stack, config)
                out[group] = _residuals(fn, x, params)
    return out


@pytest.fixture(scope="module", params=list(MODELS))
def layer_residuals(request) -> tuple[str, dict[str, list]]:
    return request.param, _traced_residuals(request.param)


def test_maxtext_layers_trace_with_the_stand_in(layer_residuals):
    """gemma3 (head dim 256), deepseek2 (MLA) and gpt-oss (sinks) layers trace on this CPU with
    attention=flash: each attention layer keeps the kernel's float32 log-sum-exp [B, Hq, S] and its
    output [B, Hq, S, Dv] (bf16), and no value [.., S, S] (a score matrix: the kernel's blocks stay
    inside it, as on a TPU)."""
    key, residuals = layer_residuals
    _, _, heads, dv, attention_layers = MODELS[key]
    assert set(residuals) == set(attention_layers)
    for group, kept in residuals.items():
        assert kept.count(((1, heads, SEQ), F32)) == attention_layers[group], (group, kept)
        assert kept.count(((1, heads, SEQ, dv), BF16)) >= attention_layers[group], (group, kept)
        assert not [s for s, _ in kept if s[-2:] == (SEQ, SEQ)], (group, kept)


@pytest.mark.slow  # ~5 s a model: the layer traces above cover the stand-in in MaxText's layers
@pytest.mark.parametrize("key", list(MODELS))
def test_tpu_target_program(key):
    """gemma3, deepseek2 and gpt-oss priced for a TPU target (program(): MaxText's program with the
    kernel's stand-in); the kernel's saved output and log-sum-exp (MaxText's ``context``) are the
    hand count's."""
    from tierax.interop.maxtext_program import program

    name, keys, heads, dv, attention_layers = MODELS[key]
    run = program(
        _model_file(name),
        [*CUT, *keys, "remat_policy=minimal"],
        target="v5p",
        devices=1,
        microbatch=1,
        seq=SEQ,
    )
    assert (run.attention, run.traced_attention) == ("flash", "flash")
    assert run.program.attention is None  # no cuDNN workspace on a TPU
    assert any("stand-in" in n for n in run.notes)
    inv = run.program.inventory
    assert {g.name: g.num_layers for g in inv.groups} == {g: 1 for g in attention_layers}
    out = SEQ * heads * dv * 2  # [B, S, Hq, Dv] bf16, B = 1
    lse = heads * SEQ * 4  # [B, Hq, S] float32
    for g in inv.groups:
        context = {a.name: a.bytes_per_layer for a in g.activations}["context"]
        assert context == attention_layers[g.name] * (out + lse), (g.name, context)
    # MaxText's minimal policy saves the kernel's inputs' projections; context is recomputed
    plan = run.plan.groups[inv.groups[0].name]
    assert plan.placements["query_proj"].value == "device"
    assert plan.placements["context"].value == "remat"


def test_same_inventory_as_cudnn_stand_in():
    """Where JAX's cuDNN attention traces too (head dim ≤ 128: MaxText's mistral block, GQA),
    both kernels give the same activations, residuals and matmul FLOPs per layer: the TPU trace
    before this stand-in and with it price the same memory."""
    from tierax.interop import maxtext_program
    from tierax.interop.maxtext_program.trace import program_inventory

    small = ["decoder_block=mistral", *M.TINY]  # d 256, 4 q / 2 kv heads of 64, 2 layers
    base = str(_configs() / "base.yml")
    invs = {}
    for kernel in ("cudnn_flash_jax", "flash"):
        keys = [*small, f"attention={kernel}"]
        with maxtext_program.load(base, keys, microbatch=2, seq=256) as loaded:
            invs[kernel] = program_inventory(loaded)
    (a,), (b,) = invs["cudnn_flash_jax"].groups, invs["flash"].groups
    assert [(x.name, x.bytes_per_layer) for x in a.activations] == [
        (x.name, x.bytes_per_layer) for x in b.activations
    ]
    assert a.save_all_bytes_per_layer == b.save_all_bytes_per_layer
    assert a.written_residual_bytes_per_layer == b.written_residual_bytes_per_layer
    assert a.forward_flops_per_layer == b.forward_flops_per_layer
    # context = the output [B, S, Hq, hd] bf16 and the float32 log-sum-exp [B, Hq, S]
    context = {x.name: x.bytes_per_layer for x in b.activations}["context"]
    assert context == 2 * 256 * 4 * 64 * 2 + 2 * 4 * 256 * 4
    assert math.isclose(a.num_layers, b.num_layers)


def test_cudnn_head_dim_refusal_remains_on_gpu():
    """A GPU target still traces cuDNN's kernel: MLA's q/k head dim 192 is refused, naming it."""
    from tierax.interop.maxtext_program import program

    name, keys, *_ = MODELS["deepseek2"]
    with pytest.raises(TieraxError, match="head dim 192"):
        program(_model_file(name), [*CUT, *keys], target="h200", devices=1, microbatch=1, seq=SEQ)


def test_unpriced_attention_refused():
    """What MaxText's splash path takes but the stand-in does not price is refused, naming it:
    QK-clip's max-logit recording (MLA's use_qk_clip)."""
    with pytest.raises(TieraxError, match="max-logit recording"):
        _traced_residuals("deepseek2", ["use_qk_clip=true"])
