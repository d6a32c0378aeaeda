import dataclasses
import importlib.util
import math
import pathlib

import pytest

from tierax import names as N
from tierax.models import for_platform, get_config
from tierax.tracing.inventory import model_inventory
from tierax.tracing.model_program import for_inventory


@pytest.fixture(scope="module")
def llama_inv():
    return model_inventory(get_config("tiny-llama"), 4, 32)


def test_bytes_per_layer_follow_shapes(llama_inv):
    cfg = get_config("tiny-llama")
    acts = {a.name: a for a in llama_inv.group("decoder").activations}
    assert acts[N.QUERY_PROJ].bytes_per_layer == 4 * 32 * cfg.num_heads * cfg.head_dim * 4
    assert acts[N.KEY_PROJ].bytes_per_layer == 4 * 32 * cfg.num_kv_heads * cfg.head_dim * 4
    assert acts[N.MLPWI_0].bytes_per_layer == 4 * 32 * cfg.mlp_dim * 4
    assert all(a.num_layers == cfg.num_layers for a in acts.values())
    assert set(acts) == set(cfg.layer_groups()[0].activations)


def test_recompute_flops_are_the_producing_matmuls(llama_inv):
    cfg = get_config("tiny-llama")
    acts = {a.name: a for a in llama_inv.group("decoder").activations}
    tokens = 4 * 32
    assert (
        acts[N.QUERY_PROJ].recompute_flops_per_layer
        == 2 * tokens * cfg.d_model * cfg.num_heads * cfg.head_dim
    )
    assert acts[N.MLPWI_0].recompute_flops_per_layer == 2 * tokens * cfg.d_model * cfg.mlp_dim
    # The down-projection's output only feeds the residual add: the backward pass never needs it.
    assert acts[N.MLPWO].recompute_flops_per_layer == 0
    g = llama_inv.group("decoder")
    assert (
        g.base_recompute_flops_per_layer > 0
    )  # attention scores are recomputed under any remat policy
    assert g.save_all_bytes_per_layer > sum(
        a.bytes_per_layer for a in acts.values() if a.name != N.MLPWO
    )


def test_state_bytes_shard_over_fsdp_and_expert():
    cfg = for_platform(get_config("deepseek-v3-671b"), "cpu")
    one = model_inventory(cfg, 1, 256, {"data": 1, "fsdp": 1})
    sharded = model_inventory(cfg, 1, 256, {"data": 1, "fsdp": 16, "expert": 8})
    assert one.param_bytes == cfg.param_count() * 4
    # Non-expert weights are FSDP-sharded over fsdp × expert, expert weights over expert (E) × fsdp:
    # every DeepSeek-V3 parameter is split 128 ways (XLA's argument bytes agree: 62.9 GB of
    # float32 parameters and Adam moments per device on 128 GB200s).
    assert sharded.param_bytes == pytest.approx(cfg.param_count() / 128 * 4, rel=1e-9)
    assert sharded.optimizer_bytes == 2 * sharded.param_bytes
    # Activations are per device: independent of the mesh at a given per-device microbatch.
    assert [a.bytes_per_layer for a in one.activations()] == [
        a.bytes_per_layer for a in sharded.activations()
    ]


def test_tensor_parallel_splits_column_parallel_activations_and_weights():
    cfg = get_config("tiny-llama")
    one = model_inventory(cfg, 2, 32)
    tp = model_inventory(cfg, 2, 32, {"fsdp": 4, "tensor": 2})
    a1 = {a.name: a.bytes_per_layer for a in one.activations()}
    a2 = {a.name: a.bytes_per_layer for a in tp.activations()}
    for name in (N.QUERY_PROJ, N.KEY_PROJ, N.VALUE_PROJ, N.ATTENTION_OUT, N.MLPWI_0, N.MLPWI_1):
        assert a2[name] * 2 == a1[name], name  # column-parallel: heads / hidden ÷ tensor
    for name in (N.OUT_PROJ, N.MLPWO, N.DECODER_LAYER_INPUT):
        assert a2[name] == a1[name], name  # row-parallel outputs are all-reduced: whole
    # 2 attention/MLP all-reduces per layer forward, ring: 2·(t−1)/t of [tokens, D] each.
    assert (
        tp.group("decoder").forward_collective_bytes_per_layer
        == 2 * 2 * 0.5 * 2 * 32 * cfg.d_model * 4
    )
    assert one.group("decoder").forward_collective_bytes_per_layer == 0
    tiled = model_inventory(dataclasses.replace(cfg, loss_tiles=4), 2, 32)
    assert tiled.logits_bytes * 4 == one.logits_bytes == 2 * 32 * cfg.vocab_size * 4


def test_activations_scale_with_microbatch():
    cfg = get_config("tiny-llama")
    a, b = model_inventory(cfg, 2, 32), model_inventory(cfg, 6, 32)
    for x, y in zip(a.activations(), b.activations(), strict=False):
        assert y.bytes_per_layer == 3 * x.bytes_per_layer


def test_blockwise_attention_keeps_workspace_linear_in_seq():
    cfg = dataclasses.replace(get_config("tiny-llama"), attention="blockwise", attention_block=64)
    short, long = model_inventory(cfg, 1, 256), model_inventory(cfg, 1, 1024)
    ratio = (
        long.group("decoder").save_all_bytes_per_layer
        / short.group("decoder").save_all_bytes_per_layer
    )
    assert ratio < 5  # 4× the sequence: no S² term
    xla = model_inventory(get_config("tiny-llama"), 1, 1024)
    assert (
        xla.group("decoder").save_all_bytes_per_layer
        > 3 * long.group("decoder").save_all_bytes_per_layer
    )


def test_example_outside_tierax_models():
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "custom_model.py"
    spec = importlib.util.spec_from_file_location("custom_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import jax
    import jax.numpy as jnp

    from tierax.tracing.inventory import layer_inventory, trace_inventory

    f32 = jnp.float32
    stacked = {
        "w_in": jax.ShapeDtypeStruct((mod.LAYERS, mod.D, mod.F), f32),
        "w_out": jax.ShapeDtypeStruct((mod.LAYERS, mod.F, mod.D), f32),
    }
    x = jax.ShapeDtypeStruct((mod.B, mod.S, mod.D), f32)
    found = {(a.group, a.name): a for a in trace_inventory(mod.loss, stacked, x)}
    assert found[("mlp", "mlpwi_0")].bytes_per_layer == mod.B * mod.S * mod.F * 4
    assert found[("mlp", "mlpwi_0")].num_layers == mod.LAYERS
    one = {k: jax.ShapeDtypeStruct(v.shape[1:], f32) for k, v in stacked.items()}
    g = layer_inventory(mod.layer, x, one, group="mlp", num_layers=mod.LAYERS)
    costs = {a.name: a.recompute_flops_per_layer for a in g.activations}
    assert costs["mlpwi_0"] == 2 * mod.B * mod.S * mod.D * mod.F
    assert math.isclose(g.forward_flops_per_layer, 4 * mod.B * mod.S * mod.D * mod.F)


def test_a_value_the_backward_never_needs_holds_nothing(llama_inv):
    """Llama's ``mlpwo`` (the down-projection's output) only feeds the residual add: JAX's partial
    evaluation drops it from the layer's residuals under any policy, so offloading it (MaxText's
    Llama 3.1 405B recipe on v7x does) holds and moves nothing.  Every other name is a residual."""
    from tierax import costmodel as cm
    from tierax import plan as P

    cfg = get_config("tiny-llama")
    acts = {a.name: a for a in llama_inv.group("decoder").activations}
    assert [n for n, a in acts.items() if not a.residual] == [N.MLPWO]
    assert acts[N.MLPWO].bytes_per_layer == 4 * 32 * cfg.d_model * 4  # the value's own size
    assert acts[N.MLPWO].held_bytes_per_layer == 0
    assert acts[N.MLPWI_0].held_total_bytes == cfg.num_layers * 4 * 32 * cfg.mlp_dim * 4
    rates = cm.target_rates("v7x", cfg.dtype)

    def host(**names):
        plan = P.Plan("p", {"decoder": P.GroupPlan({n: P.Placement(v) for n, v in names.items()})})
        return cm.simulate(plan, for_inventory(cfg, llama_inv), rates, "lhs").host_bytes

    carry = cfg.num_layers * 4 * 32 * cfg.d_model * 4  # L × b·s·d float32
    assert host(decoder_layer_input="offload", mlpwo="offload") == carry
    # mlpwi_0, made after the attention, is stored a layer later by the prefetching scan: its last
    # layer stays on device, the host holds the others
    assert host(decoder_layer_input="offload", mlpwi_0="offload") == carry + (
        cfg.num_layers - 1
    ) * (4 * 32 * cfg.mlp_dim * 4)
    # save-all (no remat) holds the layer's residuals, JAX's own set (its VJP closure), mlpwo not
    # among them: the kept names and the unnamed rest add up to it.
    g = llama_inv.group("decoder")
    b = cm.simulate(
        P.preset("save-all", cfg), for_inventory(cfg, llama_inv), rates, "lhs"
    ).breakdown
    assert b.activation_bytes == cfg.num_layers * g.save_all_bytes_per_layer
