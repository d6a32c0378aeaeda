"""The prefetching layer scan (tierax.models.prefetch) and the tag tape it stands on.

* the tape injects saved values: hand-computed values and derivatives of a two-line function;
* the scan's gradient equals an independent one — ``jax.grad`` of a plain Python loop over the
  layers, no custom VJP, no scan — for a toy layer with kept, offloaded and recomputed names;
* its residuals: offloaded names live in host memory in the forward, are copied back in the
  backward, and the copy of layer i−1 is issued in layer i's iteration (XLA's own schedule of a
  deviceless H200 compile: each host load's value leaves the loop body for the next iteration
  and feeds no computation in its own; XLA's offload policy loads and consumes in one iteration);
* a deviceless compile states the run's device budget to XLA's scheduler.

The gradient battery (test_plan_battery.py) checks every model × preset under both mechanisms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax import hardware
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models.prefetch import prefetch_scan
from tierax.models.tags import Tape, tag
from tierax.xla import hlo


def test_injected_value_replaces_the_tagged_one_and_the_gradient_flows_to_its_producer():
    # f(x) = sin(tag(3x)); with 3x replaced by s: value sin(s), derivative cos(s) · 3 (chain through
    # 3x).
    def f(x, s=None):
        tape = Tape(inject={"query_proj": s}) if s is not None else Tape()
        with tape.active():
            return jnp.sin(tag(3.0 * x, "query_proj"))

    x = jnp.float32(0.4)
    s = jnp.float32(
        1.3
    )  # deliberately not 3x: shows which value the forward and the derivative use
    assert float(f(x, s)) == pytest.approx(np.sin(1.3), rel=1e-6)
    assert float(jax.grad(f)(x, s)) == pytest.approx(np.cos(1.3) * 3.0, rel=1e-6)
    assert float(jax.grad(f)(x)) == pytest.approx(np.cos(1.2) * 3.0, rel=1e-6)


def test_tape_collects_and_refuses_duplicates_and_missing_names():
    tape = Tape(collect={"key_proj"})
    with tape.active():
        tag(jnp.ones(2), "key_proj")
        tag(jnp.ones(2), "value_proj")  # not asked for: not kept
    assert set(tape.values) == {"key_proj"}
    with pytest.raises(TieraxError, match="tagged twice"), Tape(collect={"key_proj"}).active():
        tag(jnp.ones(2), "key_proj")
        tag(jnp.ones(2), "key_proj")
    t = Tape(collect={"mlpwi_0"})
    with t.active():
        tag(jnp.ones(2), "key_proj")
    with pytest.raises(TieraxError, match="never tags 'mlpwi_0'"):
        t.check_complete()
    with (
        pytest.raises(TieraxError, match=r"saved 'key_proj' is float32\[3\]"),
        Tape(inject={"key_proj": jnp.ones(3)}).active(),
    ):
        tag(jnp.ones(2), "key_proj")


def _toy_layer(x, p):
    """A residual layer with three tagged values: q (offloaded), h (kept) and g (recomputed)."""
    q = tag(jnp.tanh(x @ p["wq"]), "query_proj")
    h = tag(q * x, "mlpwi_0")
    g = tag(jax.nn.silu(h @ p["wg"]), "mlpwi_1")
    return x + g @ p["wo"] + jnp.sin(q)


def _toy_params(n_layers=5, d=8, seed=0):
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

    return (
        {
            "wq": normal(n_layers, d, d) / d,
            "wg": normal(n_layers, d, 2 * d) / d,
            "wo": normal(n_layers, 2 * d, d) / d,
        },
        normal(4, d),
    )


def test_scan_gradient_equals_a_plain_loop():
    params, x0 = _toy_params()
    run = prefetch_scan(_toy_layer, keep={"mlpwi_0"}, offload={"query_proj"})
    assert_scan_matches_loop(run, _toy_layer, params, x0)


def assert_scan_matches_loop(run, layer, params, x0) -> None:
    """``run`` (a prefetching scan of ``layer``) has the loss and gradients of a plain Python loop
    over the stacked ``params`` (the reference: no scan, no custom VJP, no tape)."""

    def loss_scan(params, x0):
        return jnp.sum(run(x0, params) ** 2)

    def loss_loop(params, x0):
        x = x0
        for i in range(params["wq"].shape[0]):
            x = layer(x, jax.tree.map(lambda a, i=i: a[i], params))
        return jnp.sum(x**2)

    v1, g1 = jax.jit(jax.value_and_grad(loss_scan, argnums=(0, 1)))(params, x0)
    v2, g2 = jax.jit(jax.value_and_grad(loss_loop, argnums=(0, 1)))(params, x0)
    assert float(v1) == pytest.approx(float(v2), rel=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_scan_refuses_a_name_the_layer_never_tags():
    params, x0 = _toy_params(n_layers=2)
    run = prefetch_scan(_toy_layer, keep=(), offload={"value_proj"})
    with pytest.raises(TieraxError, match="never tags 'value_proj'"):
        jax.grad(lambda p: jnp.sum(run(x0, p)))(params)


def test_offloaded_residuals_are_host_arrays_between_the_passes():
    params, x0 = _toy_params(n_layers=3)
    run = prefetch_scan(_toy_layer, keep={"mlpwi_0"}, offload={"query_proj"})
    text = str(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(run(x0, p))))(params))
    # q, made before the attention, stored in its own layer: a host slice for every layer,
    # fetched before the backward's loop and in it
    assert "f32<host>[3,4,8]" in text
    assert text.count("MemorySpace.Host") >= 1 and text.count("MemorySpace.Device") >= 2
    # g (the MLP's, made late) stored a layer later: every layer's slice but the last, which stays
    # on device for the backward (it starts with it)
    run = prefetch_scan(_toy_layer, keep={"mlpwi_0"}, offload={"mlpwi_1"})
    text = str(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(run(x0, p))))(params))
    assert "f32<host>[2,4,16]" in text and "f32<host>[3,4,16]" not in text


def _host_loads(module: hlo.Module, cname: str):
    """(load's -done instruction, its users) for each host → device copy issued in computation
    ``cname``."""
    instrs = module.computations[cname]
    users: dict[str, list] = {}
    for ins in instrs:
        for o in ins.operands:
            users.setdefault(o, []).append(ins)
    out = []
    for ins in instrs:
        src = module.by_name.get(ins.operands[0]) if ins.operands else None
        if ins.opcode.endswith("-start") and src is not None and any(a.host for a in src.arrays):
            for done in users.get(ins.name, []):
                if done.opcode.endswith("-done") and not any(
                    a.host for a in done.arrays
                ):  # a load, not a store
                    out.append((done, users))
    return out


def _feeds_only_the_loop_carry(name: str, users: dict, root) -> bool:
    """True if ``name``'s value reaches only the loop body's ROOT tuple (through
    bitcasts/copies)."""
    for u in users.get(name, []):
        if u is root:
            continue
        if u.opcode in ("bitcast", "copy", "reshape") and _feeds_only_the_loop_carry(
            u.name, users, root
        ):
            continue
        return False
    return bool(users.get(name))


def _backward_body_loads(mechanism: str):
    from tierax.models import get_config
    from tierax.xla import compile as C

    cfg = get_config("tiny-llama")
    plan = P.Plan("qkv", P.preset("qkv-offload", cfg).groups, mechanism=mechanism)
    _, text = C.compile_for_target(cfg, plan, "h200", microbatch=2, seq=64)
    module = hlo.parse_module(text)
    bodies = {
        ins.attr("body")
        for instrs in module.computations.values()
        for ins in instrs
        if ins.opcode == "while"
    }
    loads = {c: _host_loads(module, c) for c in bodies if c in module.computations}
    loads = {c: v for c, v in loads.items() if v}
    assert loads, "no loop body loads from host"
    return module, loads


@pytest.mark.parametrize("mechanism", ["prefetch", "policy"])
def test_xla_schedule_prefetch_hands_each_load_to_the_next_iteration(mechanism):
    module, loads = _backward_body_loads(mechanism)
    ((body, found),) = loads.items()
    assert len(found) == 3  # q, k and v of one layer per iteration
    root = module.computations[body][-1]
    assert root.opcode == "tuple"
    carried = [_feeds_only_the_loop_carry(done.name, users, root) for done, users in found]
    if mechanism == "prefetch":
        assert all(carried)  # issued one iteration ahead: nothing in this iteration waits for it
    else:
        assert not any(carried)  # XLA's policy: loaded and consumed in the same iteration


def test_deviceless_target_states_the_runs_budget_to_the_scheduler():
    spec = hardware.TARGETS["h200"]
    text = hardware.scheduling_target_config(hardware.render_target_config(spec))
    stated = int(
        next(line for line in text.splitlines() if "device_memory_size" in line).split(":")[1]
    )
    # XLA schedules within 80 % of the stated size; that must be capacity less the 5 % runtime
    # reserve.
    assert stated == int(spec.device_memory_bytes * 0.95 / 0.8)
    assert int(stated * 0.8) == pytest.approx(
        hardware.usable_bytes(spec.device_memory_bytes), abs=1
    )
    with pytest.raises(TieraxError, match="no gpu_device_info.device_memory_size.*--target-config"):
        hardware.scheduling_target_config("gpu_device_info { core_count: 1 }")
