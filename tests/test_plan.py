import contextlib
import dataclasses
import io

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from tierax import names as N
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import NAMED_CONFIGS, get_config
from tierax.models.prefetch import Prefetch

MODELS = list(NAMED_CONFIGS)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("preset", list(P.PRESETS))
def test_yaml_round_trip(model, preset):
    cfg = get_config(model)
    plan = P.preset(preset, cfg)
    back = P.Plan.from_yaml(plan.to_yaml())
    assert back == plan
    assert P.resolve(back, cfg) == P.resolve(plan, cfg)


def test_presets_mean_what_they_say():
    cfg = get_config("tiny-deepseek")
    r = P.resolve(P.preset("save-all", cfg), cfg)
    assert all(p is P.Placement.DEVICE for g in r.values() for p in g.values())
    r = P.resolve(P.preset("remat-full", cfg), cfg)
    for g in r.values():
        assert {n for n, p in g.items() if p is not P.Placement.REMAT} == {N.DECODER_LAYER_INPUT}
    r = P.resolve(P.preset("qkv-offload", cfg), cfg)
    for g in r.values():
        assert {n for n, p in g.items() if p is P.Placement.OFFLOAD} == {
            N.QUERY_PROJ,
            N.KEY_PROJ,
            N.VALUE_PROJ,
        }
    r = P.resolve(P.preset("deepseek-offload", cfg), cfg)
    qkv = {N.QUERY_PROJ, N.KEY_PROJ, N.VALUE_PROJ}
    assert {n for n, p in r["dense"].items() if p is P.Placement.OFFLOAD} == qkv | {
        N.MLPWI_0,
        N.MLPWI_1,
    }
    assert {n for n, p in r["moe"].items() if p is P.Placement.OFFLOAD} == qkv | {
        N.MOE_MLPWI_0,
        N.MOE_MLPWI_1,
    }
    r = P.resolve(P.preset("minimal", cfg), cfg)
    assert (
        r["moe"][N.MOE_MLPWO] is P.Placement.DEVICE
        and r["moe"][N.ATTENTION_OUT] is P.Placement.REMAT
    )


def test_to_policies_none_only_when_everything_on_device():
    cfg = get_config("tiny-deepseek")
    assert P.to_policies(P.preset("save-all", cfg), cfg) == {"dense": None, "moe": None}
    pols = P.to_policies(dataclasses.replace(P.preset("qkv-offload", cfg), mechanism="policy"), cfg)
    assert set(pols) == {"dense", "moe"} and all(callable(p) for p in pols.values())


def test_prefetch_mechanism_keeps_and_offloads_what_the_plan_says():
    """Default mechanism: a group that offloads runs the prefetching scan with the plan's device and
    host
    names (the layer input is the scan's own residual); a group that offloads nothing gets a
    policy."""
    cfg = get_config("tiny-deepseek")
    pols = P.to_policies(MIXED, cfg)  # MIXED names no mechanism
    resolved = P.resolve(MIXED, cfg)
    for g in ("dense", "moe"):
        assert isinstance(pols[g], Prefetch)
        assert pols[g].offload == {n for n, p in resolved[g].items() if p is P.Placement.OFFLOAD}
        assert pols[g].keep == {n for n, p in resolved[g].items() if p is P.Placement.DEVICE} - {
            N.DECODER_LAYER_INPUT
        }
    assert N.MOE_MLPWI_1 in pols["moe"].offload and N.VALUE_PROJ in pols["moe"].keep
    assert N.MLPWI_1 in pols["dense"].keep  # the dense group's default is device
    assert all(
        callable(p) and not isinstance(p, Prefetch)
        for p in P.to_policies(P.preset("minimal", cfg), cfg).values()
    )
    # Offloading the layer input itself: the scan cannot prefetch its own carry, so XLA's policy
    # runs it.
    lin = P.Plan(
        "lin",
        {"dense": P.GroupPlan({N.DECODER_LAYER_INPUT: P.Placement.OFFLOAD}), "moe": P.GroupPlan()},
    )
    assert callable(P.to_policies(lin, cfg)["dense"])


def test_mechanism_round_trips_and_is_validated():
    cfg = get_config("tiny-llama")
    plan = dataclasses.replace(P.preset("qkv-offload", cfg), mechanism="policy")
    assert "mechanism: policy" in plan.to_yaml()
    assert P.Plan.from_yaml(plan.to_yaml()) == plan
    assert (
        "mechanism" not in P.preset("qkv-offload", cfg).to_yaml()
    )  # the default is not spelled out
    with pytest.raises(TieraxError, match="mechanism 'prefech' is not valid; use one of: prefetch"):
        P.Plan.from_yaml(plan.to_yaml().replace("mechanism: policy", "mechanism: prefech"))


def _tagged(name: str):
    x = jnp.ones((2, 3))
    return jax.make_jaxpr(lambda v: checkpoint_name(v, name))(x).jaxpr.eqns[0], x


def _decision(policy, name: str) -> str:
    """What a jax.checkpoint policy does with a value tagged ``name``: save, offload (to pinned
    host) or remat."""
    eqn, x = _tagged(name)
    return _kind(policy(eqn.primitive, x, **eqn.params))


def _kind(d) -> str:
    """A policy's decision named by the JAX policy that decides the same for a tagged value: saved,
    offloaded device → pinned host, or recomputed (JAX's simple policies answer True / False)."""
    if isinstance(d, bool):
        return "save" if d else "remat"
    eqn, x = _tagged("t")
    for kind, saved, offloaded in (("save", ["t"], []), ("offload", [], ["t"]), ("remat", [], [])):
        ref = jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=saved,
            names_which_can_be_offloaded=offloaded,
            offload_src="device",
            offload_dst="pinned_host",
        )
        if d == ref(eqn.primitive, x, **eqn.params):
            return kind
    raise AssertionError(f"not a decision of jax.checkpoint's: {d!r}")


MIXED = P.Plan(
    "mixed",
    {
        "dense": P.GroupPlan(
            {
                N.QUERY_PROJ: P.Placement.OFFLOAD,
                N.KEY_PROJ: P.Placement.DEVICE,
                N.MLPWI_0: P.Placement.OFFLOAD,
                N.MLPWO: P.Placement.REMAT,
            },
            P.Placement.DEVICE,
        ),
        "moe": P.GroupPlan(
            {N.MOE_MLPWI_1: P.Placement.OFFLOAD, N.VALUE_PROJ: P.Placement.DEVICE},
            P.Placement.REMAT,
        ),
    },
)


@pytest.mark.parametrize(
    "plan", ["qkv-offload", "deepseek-offload", "minimal", "remat-full", "mixed"]
)
def test_policy_saves_offloads_and_recomputes_exactly_what_the_plan_says(plan):
    """Per layer group and name, the policy's decision is the plan's placement: device → saved in
    device
    memory, offload → moved device → pinned_host, remat → recomputed; untagged values are
    recomputed."""
    cfg = get_config("tiny-deepseek")
    p = dataclasses.replace(MIXED if plan == "mixed" else P.preset(plan, cfg), mechanism="policy")
    want = {"device": "save", "offload": "offload", "remat": "remat"}
    resolved = P.resolve(p, cfg)
    policies = P.to_policies(p, cfg)
    seen = set()
    for g, names in resolved.items():
        if policies[g] is None:
            assert all(pl is P.Placement.DEVICE for pl in names.values())
            continue
        for n, pl in names.items():
            if n == N.DECODER_LAYER_INPUT and pl is P.Placement.DEVICE:
                # Kept as the checkpointed body's own input, not by name (test below).
                assert _decision(policies[g], n) == "remat", (plan, g)
                continue
            assert _decision(policies[g], n) == want[pl.value], (plan, g, n)
            seen.add(pl)
        # An untagged matmul is not saved (what "remat" means for everything the plan does not
        # name).
        x = jnp.ones((2, 2))
        dot = jax.make_jaxpr(lambda a: a @ a)(x).jaxpr.eqns[0]
        assert _kind(policies[g](dot.primitive, x, x, **dot.params)) == "remat"
    if plan == "mixed":
        assert seen == set(P.Placement)
        assert (
            _decision(policies["dense"], N.MLPWI_1) == "save"
        )  # the dense group's default is device
        assert _decision(policies["moe"], N.MOE_MLPWI_0) == "remat"


def test_layer_input_on_device_is_saved_as_the_checkpoint_input_without_a_copy():
    """remat-full under XLA's policy: the layer's input is a residual (the checkpointed body's
    argument), and
    no reduce_precision copy of it is made (JAX adds one to every residual saved by name, jax PR
    22244)."""
    cfg = get_config("tiny-llama")
    policy = P.to_policies(
        dataclasses.replace(P.preset("remat-full", cfg), mechanism="policy"), cfg
    )["decoder"]

    def layer(x, w):
        return jnp.tanh(checkpoint_name(x, N.DECODER_LAYER_INPUT) @ w)

    x, w = jnp.ones((4, 8)), jnp.ones((8, 8))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(jax.checkpoint(layer, policy=policy), x, w)
    saved = out.getvalue().strip().splitlines()
    assert any(line.startswith("f32[4,8]") and "argument" in line for line in saved), saved
    assert not any("named" in line for line in saved), saved
    grad = jax.make_jaxpr(
        jax.grad(lambda x, w: jnp.sum(jax.checkpoint(layer, policy=policy)(x, w)))
    )(x, w)
    assert "reduce_precision" not in str(grad)


def test_unknown_activation_name_lists_valid_names():
    text = "plan: bad\ngroups:\n  decoder:\n    query_projj: offload\n"
    plan = P.Plan.from_yaml(text)  # any name parses: a model traced by tierax.api tags its own
    with pytest.raises(TieraxError) as e:
        P.resolve(plan, get_config("tiny-llama"))  # checked against what the model tags
    assert "no activation 'query_projj' (did you mean 'query_proj'?)" in str(e.value)
    assert "valid names here: decoder_layer_input, query_proj" in str(e.value)
    assert "mlpwi_0" in str(e.value)


def test_misspelled_placement_lists_valid_values():
    text = "plan: bad\ngroups:\n  decoder:\n    query_proj: offlaod\n"
    with pytest.raises(TieraxError, match="device, offload, remat"):
        P.Plan.from_yaml(text)


def test_name_the_model_lacks_is_an_error():
    # moe_mlpwi_0 is a valid name, but a Llama layer has no routed experts.
    plan = P.Plan("p", {"decoder": P.GroupPlan({N.MOE_MLPWI_0: P.Placement.OFFLOAD})})
    with pytest.raises(TieraxError, match="no activation 'moe_mlpwi_0'.*valid names here"):
        P.to_policies(plan, get_config("tiny-llama"))


def test_unknown_group_is_an_error():
    plan = P.Plan("p", {"decoderr": P.GroupPlan({N.QUERY_PROJ: P.Placement.OFFLOAD})})
    with pytest.raises(TieraxError, match="its groups: decoder"):
        P.resolve(plan, get_config("tiny-llama"))


def test_unknown_top_level_key_and_bad_yaml():
    with pytest.raises(TieraxError, match="unknown key"):
        P.Plan.from_yaml("plan: x\ngroup: {}\n")
    with pytest.raises(TieraxError, match="not valid YAML"):
        P.Plan.from_yaml("plan: [unclosed\n")


def test_load_plan_from_file_and_missing(tmp_path):
    cfg = get_config("tiny-llama")
    f = tmp_path / "p.yaml"
    f.write_text(P.preset("qkv-offload", cfg).to_yaml())
    assert P.load_plan(str(f), cfg) == P.preset("qkv-offload", cfg)
    with pytest.raises(TieraxError, match="neither a preset"):
        P.load_plan(str(tmp_path / "nope.yaml"), cfg)


def test_plan_is_immutable():
    plan = P.preset("minimal", get_config("tiny-llama"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.name = "x"
    with pytest.raises(TypeError):
        plan.groups["decoder"] = P.GroupPlan()
    with pytest.raises(TypeError):
        plan.groups["decoder"].placements[N.QUERY_PROJ] = P.Placement.OFFLOAD
