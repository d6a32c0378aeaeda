"""bench/xla_cost_check.py's arithmetic, and the ``scan_unroll`` it relies on: XLA's cost analysis
counts a loop body once, so a scan of 2 layers per trip is counted one layer more than a scan of 1,
with the same result."""

import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.models import apply_overrides, build_model, get_config

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


def _module():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("xla_cost_check", BENCH / "xla_cost_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_solve_recovers_body_outside_work_and_rest():
    # rest 100, 3 per layer outside the loop, a body of 50 counted once per layer it holds:
    # (2 layers, loop inlined: 2 counted) 100 + 2·3 + 2·50; (4, one per trip) 100 + 4·3 + 50;
    # (4, two per trip) 100 + 4·3 + 2·50
    mod = _module()
    got = mod.solve([(2, 2, 206.0), (4, 1, 162.0), (4, 2, 212.0)])
    assert got == pytest.approx(
        {"body": 50.0, "outside_per_layer": 3.0, "per_layer": 53.0, "fixed": 100.0}
    )
    # the same with every loop kept: (2, 1) 100 + 2·3 + 50
    got = mod.solve([(2, 1, 156.0), (4, 1, 162.0), (4, 2, 212.0)])
    assert got["per_layer"] == pytest.approx(53.0) and got["fixed"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="do not separate"):
        mod.solve([(2, 1, 156.0), (4, 1, 162.0), (4, 1, 162.0)])
    # counted every trip: 2 layers 2·7 + 11, 4 layers 4·7 + 11
    assert mod.per_layer(25.0, 39.0) == {"per_layer": 7.0, "fixed": 11.0}


def test_a_layer_loop_is_told_from_a_collective_matmul_loop():
    pattern = _module().LAYER_LOOP
    assert pattern.search("jit(step)/jvp(tierax_group_decoder)/while")
    assert pattern.search("jit(step)/transpose(jvp(tierax_group_decoder))/while")
    assert not pattern.search(
        "jit(step)/jvp(tierax_group_decoder)/while/body/closed_call/dot_general"
    )


def _grad_cost(layers: int, unroll: int):
    cfg = apply_overrides(
        get_config("tiny-llama"), [f"num_layers={layers}", f"scan_unroll={unroll}"]
    )
    graphdef, state = nnx.split(build_model(cfg))
    policies = plan_lib.to_policies(plan_lib.load_plan("remat-full", cfg), cfg)
    tokens = jnp.arange(2 * 32, dtype=jnp.int32).reshape(2, 32) % cfg.vocab_size

    def loss(state):
        return nnx.merge(graphdef, state)(tokens, policies).astype(jnp.float32).mean()

    fn = jax.jit(jax.value_and_grad(loss))
    ca = fn.lower(state).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    value, grads = fn(state)
    return ca["flops"], value, grads


@pytest.mark.slow  # three XLA:CPU compiles and runs: ~30 s on a loaded 2-core machine
def test_two_layers_per_trip_count_one_more_layer_with_the_same_result():
    f21, v21, _ = _grad_cost(2, 1)
    f41, v41, g41 = _grad_cost(4, 1)
    f42, v42, g42 = _grad_cost(4, 2)
    # one layer per trip: the body once at any depth (only the per-layer work outside the loop
    # grows); two per trip: one more layer's forward, backward and recomputation
    body = f42 - f41
    assert abs(f41 - f21) < 0.05 * body
    assert body > 0.2 * f41
    np.testing.assert_allclose(v42, v41, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g42), jax.tree.leaves(g41), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_scan_unroll_reaches_the_layer_scan():
    cfg = apply_overrides(get_config("tiny-llama"), ["num_layers=4", "scan_unroll=2"])
    graphdef, state = nnx.split(build_model(cfg))
    policies = plan_lib.to_policies(plan_lib.load_plan("remat-full", cfg), cfg)
    tokens = jnp.zeros((1, 16), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(tokens, policies))(state)
    scans = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    assert [(e.params["length"], e.params["unroll"]) for e in scans] == [(4, 2)]


def test_scan_unroll_is_refused_where_the_scan_cannot_unroll():
    with pytest.raises(TieraxError, match="scan_unroll must be an integer"):
        apply_overrides(get_config("tiny-llama"), ["scan_unroll=0"])
    cfg = apply_overrides(get_config("tiny-llama"), ["scan_unroll=2"])
    plan = plan_lib.Plan.from_dict(
        {
            "plan": "seg",
            "groups": {
                "decoder": {
                    "default": "remat",
                    "segments": [{"layers": f"0-{cfg.num_layers - 1}"}],
                }
            },
        }
    )
    model = build_model(cfg)
    tokens = jnp.zeros((1, 16), jnp.int32)
    with pytest.raises(TieraxError, match="segmented layer group runs one layer per trip"):
        model(tokens, plan_lib.to_policies(plan, cfg))
