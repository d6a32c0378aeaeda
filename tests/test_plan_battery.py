"""The shared battery: every model × every preset.

* loss and gradients equal the ``save-all`` step (float32 tiny configs: max relative
  error per leaf ≤ 1e-5, relative to the leaf's largest magnitude);
* lowered for CUDA without a GPU, the ``pinned_host`` placements are exactly the
  offloaded names' residuals, and save/remat plans have none;
* on CPU with scanned layers, compiled temp bytes strictly decrease
  save-all → minimal → remat-full.
"""

import collections
import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tierax import plan as plan_lib
from tierax.models import abstract_model, apply_overrides, get_config
from tierax.models.prefetch import Prefetch
from tierax.tracing import jaxpr_tools
from tierax.train import step as S

TINY = ["tiny-llama", "tiny-deepseek"]
TOL = 1e-5


@pytest.fixture(
    scope="module",
    # Mixtral's experts as dropless grouped GEMMs (moe_impl=ragged): the gradient battery only
    params=[*TINY, "tiny-mixtral:moe_impl=ragged"],
)
def reference(request):
    name, _, sets = request.param.partition(":")
    cfg = apply_overrides(get_config(name), [sets] if sets else [])
    graphdef, params = S.init_params(cfg, seed=1)
    tokens = S.synthetic_batch(cfg, 4, 32, seed=2)
    loss, grads = S.loss_and_grads(graphdef, cfg, plan_lib.preset("save-all", cfg), params, tokens)
    return cfg, graphdef, params, tokens, loss, grads


def max_rel_err(a, b) -> float:
    scale = jnp.maximum(jnp.max(jnp.abs(b)), jnp.finfo(jnp.float32).tiny)
    return float(jnp.max(jnp.abs(a - b)) / scale)


OFFLOADING = [p for p in plan_lib.PRESETS if p.endswith("offload")]
CASES = [(p, plan_lib.DEFAULT_MECHANISM) for p in plan_lib.PRESETS if p != "save-all"] + [
    (p, "policy") for p in OFFLOADING
]


@pytest.mark.parametrize("preset, mechanism", CASES)
@pytest.mark.slow  # a gradient compile per preset × mechanism (test_verify: every preset)
def test_gradients_match_save_all(reference, preset, mechanism):
    """Both offload mechanisms: tierax's prefetching scan (the default) and XLA's checkpoint
    policy."""
    cfg, graphdef, params, tokens, ref_loss, ref_grads = reference
    plan = dataclasses.replace(plan_lib.preset(preset, cfg), mechanism=mechanism)
    if preset in OFFLOADING:
        prefetching = [isinstance(v, Prefetch) for v in plan_lib.to_policies(plan, cfg).values()]
        assert all(prefetching) if mechanism == "prefetch" else not any(prefetching)
    loss, grads = S.loss_and_grads(graphdef, cfg, plan, params, tokens)
    assert abs(float(loss) - float(ref_loss)) <= TOL * abs(float(ref_loss))
    errs = jax.tree.map(max_rel_err, grads, ref_grads)
    worst = max(jax.tree.leaves(errs))
    assert worst <= TOL, f"{cfg.name}/{preset}: max relative gradient error {worst:.3g}"
    assert len(jax.tree.leaves(grads)) == len(jax.tree.leaves(ref_grads))


def _cuda_pinned_host_shapes(cfg, plan, tokens) -> list[str]:
    graphdef, params = nnx.split(abstract_model(cfg))
    loss = S.make_loss_fn(graphdef, plan_lib.to_policies(plan, cfg))
    text = (
        jax.jit(jax.value_and_grad(loss))
        .trace(params, tokens)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    found = re.findall(
        r'annotate_device_placement\(%[^)]*\).*?_xla_buffer_placement = "(\w+)".*?-> '
        r"tensor<([^>]*)>",
        text,
    )
    assert found or "annotate_device_placement" not in text
    return sorted(shape for where, shape in found if where == "pinned_host")


def _tensor_type(shape, dtype) -> str:
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]
    return "x".join(map(str, shape)) + "x" + short


@pytest.mark.parametrize("model", TINY)
@pytest.mark.parametrize("preset", list(plan_lib.PRESETS))
def test_cuda_lowering_offloads_exactly_the_offloaded_names(model, preset):
    cfg = get_config(model)
    plan = plan_lib.preset(preset, cfg)
    tokens = jax.ShapeDtypeStruct((2, 17), jnp.int32)
    got = _cuda_pinned_host_shapes(cfg, plan, tokens)

    graphdef, params = nnx.split(abstract_model(cfg))
    fwd = jax.make_jaxpr(lambda p, t: nnx.merge(graphdef, p)(t[:, :-1]))(params, tokens)
    placements = plan_lib.resolve(plan, cfg)
    expected = sorted(
        _tensor_type(v.shape, v.dtype)
        for v in jaxpr_tools.named_values(fwd)
        if placements[v.group][v.name] is plan_lib.Placement.OFFLOAD
    )
    assert got == expected
    n_offloaded = sum(
        p is plan_lib.Placement.OFFLOAD for g in placements.values() for p in g.values()
    )
    assert len(got) == n_offloaded
    if preset in ("save-all", "remat-full", "minimal"):
        assert got == []
    else:
        assert got


@pytest.mark.parametrize(
    "model", ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]  # MoE: 10 s
)
def test_compiled_temp_decreases_with_more_remat(model):
    cfg = get_config(model)
    graphdef, params = nnx.split(abstract_model(cfg))
    tokens = jax.ShapeDtypeStruct((8, 65), jnp.int32)
    temps = collections.OrderedDict()
    for preset in ("save-all", "minimal", "remat-full"):
        loss = S.make_loss_fn(graphdef, plan_lib.to_policies(plan_lib.preset(preset, cfg), cfg))
        compiled = jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()
        temps[preset] = compiled.memory_analysis().temp_size_in_bytes
    t = list(temps.values())
    assert t[0] > t[1] > t[2], temps
