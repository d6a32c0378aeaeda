import dataclasses
import math

import jax
import pytest
from flax import nnx

from tierax.errors import TieraxError
from tierax.models import NAMED_CONFIGS, abstract_model, get_config


def traced_param_count(cfg) -> int:
    _, params = nnx.split(abstract_model(cfg))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("name", list(NAMED_CONFIGS))
def test_analytic_param_count_equals_traced_model(name):
    cfg = get_config(name)
    assert traced_param_count(cfg) == cfg.param_count()


@pytest.mark.parametrize(
    "name, published, rel",
    [
        ("llama3-8b", 8.03e9, 0.01),
        ("llama3.1-8b", 8.03e9, 0.01),
        ("llama3.1-405b", 405.9e9, 0.01),
        ("deepseek-v3-671b", 671e9, 0.01),
        # Hugging Face's model cards / safetensors index totals
        ("llama2-7b", 6_738_415_616, 1e-9),
        ("llama2-70b", 68_976_648_192, 1e-9),
        ("llama3-70b", 70_553_706_496, 1e-9),
        ("llama3.1-70b", 70_553_706_496, 1e-9),
        # MaxText's model name for DeepSeek-V3
        ("deepseek3-671b", 671e9, 0.01),
    ],
)
def test_param_count_matches_published(name, published, rel):
    assert get_config(name).param_count() == pytest.approx(published, rel=rel)


def test_mu_dtype_sets_the_first_moments_dtype_and_bytes():
    import jax.numpy as jnp

    from tierax.errors import TieraxError
    from tierax.models import apply_overrides
    from tierax.tracing import inventory as inv_lib
    from tierax.train import step as S

    cfg = apply_overrides(get_config("tiny-llama"), ["mu_dtype=bfloat16"])
    opt = S.make_optimizer(mu_dtype=cfg.mu_dtype)
    state = opt.init({"w": jnp.ones((3, 4), jnp.float32)})
    assert state[0].mu["w"].dtype == jnp.bfloat16 and state[0].nu["w"].dtype == jnp.float32
    inv = inv_lib.model_inventory(cfg, 2, 16, {"fsdp": 1})
    # float32 parameters (4 B each): mu 2 B + nu 4 B per parameter
    assert inv.optimizer_bytes == inv.param_bytes // 4 * (2 + 4)
    plain = inv_lib.model_inventory(get_config("tiny-llama"), 2, 16, {"fsdp": 1})
    assert plain.optimizer_bytes == 2 * plain.param_bytes
    with pytest.raises(TieraxError, match="mu_dtype='int8'"):
        apply_overrides(get_config("tiny-llama"), ["mu_dtype=int8"])


def test_deepseek_activated_params_match_published():
    # DeepSeek-V3 reports "37B activated" (two significant digits, i.e. 36.5–37.5 B).
    # Ours counts embedding + head + top-8 routed + shared experts: 37.55 B.
    # The published figure's own rounding is ±1.4 %, so the stated tolerance is 2 %.
    assert get_config("deepseek-v3-671b").activated_param_count() == pytest.approx(37e9, rel=0.02)


def test_dense_model_activates_everything():
    cfg = get_config("llama3-8b")
    assert cfg.activated_param_count() == cfg.param_count()


@pytest.mark.parametrize(
    "name, change, fragment",
    [
        ("tiny-llama", {"num_kv_heads": 3}, "not divisible by num_kv_heads"),
        ("tiny-llama", {"d_model": 0}, "d_model must be a positive integer"),
        ("tiny-llama", {"dtype": "float8"}, "not a supported dtype"),
        ("tiny-deepseek", {"num_experts_per_tok": 9}, "exceeds num_experts"),
        ("tiny-deepseek", {"first_dense_layers": 5}, "first_dense_layers"),
        ("tiny-deepseek", {"capacity_factor": 0.0}, "capacity_factor"),
    ],
)
def test_bad_config_values_are_clear_errors(name, change, fragment):
    with pytest.raises(TieraxError, match=fragment):
        dataclasses.replace(get_config(name), **change)


def test_unknown_model_lists_valid_names():
    with pytest.raises(TieraxError, match="tiny-llama"):
        get_config("tiny-lama")


def test_layer_groups():
    ds = get_config("deepseek-v3-671b")
    assert [(g.name, g.num_layers) for g in ds.layer_groups()] == [("dense", 3), ("moe", 58)]
    assert "moe_mlpwi_0" in ds.layer_groups()[1].activations
    assert "moe_mlpwi_0" not in ds.layer_groups()[0].activations
    assert [g.name for g in get_config("llama3-8b").layer_groups()] == ["decoder"]
