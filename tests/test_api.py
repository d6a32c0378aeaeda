"""The Python API (tierax.inventory / tierax.plan / plan.policy) and the two examples that use
it."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import tierax
import tierax.api
from tierax.errors import TieraxError
from tierax.tracing import jaxpr_tools

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # flax's dataclass transform looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_import_tierax_loads_no_jax_and_the_modules_stay_modules():
    code = (
        "import sys, tierax; assert 'jax' not in sys.modules, 'jax imported'; "
        "import tierax.tracing.inventory, tierax.plan; "
        "assert callable(tierax.inventory) and callable(tierax.plan); "
        "assert tierax.inventory is tierax.tracing.inventory; "
        "assert tierax.inventory.trace_inventory and tierax.plan.Plan; "
        "from tierax.plan import Placement; print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"]},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _gpu_aot() -> bool:
    from tierax.xla import compile as tc

    try:
        tc.check_gpu_aot()
        return True
    except TieraxError:
        return False


def test_jax_example_runs_as_a_script_and_compiles_for_a_gpu_deviceless():
    """The plain-JAX example end to end, as a user runs it: plan, gradient check, deviceless H200
    compile."""
    cmd = [sys.executable, str(EXAMPLES / "jax_scan_model.py"), "--squeeze", "0.9"]
    if _gpu_aot():
        cmd += ["--compile-for", "h200"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'remat'" in out.stdout and "max relative error 0.00e+00" in out.stdout
    if _gpu_aot():
        assert "compiled for h200 (deviceless): temp" in out.stdout


# squeeze: the share of the unconstrained plan's own bytes (beside XLA:GPU's fixed buffers) the
# budget leaves; at 0.95 the flax model gives up only its unnamed intermediates
@pytest.mark.parametrize(
    "example, group, squeeze",
    [("jax_scan_model", "mlp", 0.9), ("flax_linen_model", "decoder", 0.9)],
)
def test_examples_plan_and_keep_the_gradients(example, group, squeeze):
    mod = _example(example)
    sizes = (
        {"layers": 4, "d": 64, "f": 256}
        if example == "jax_scan_model"
        else {"layers": 2, "d_model": 32, "seq": 16}
    )
    out = mod.run(squeeze=squeeze, **sizes)
    planned = out["planned"]
    placements = planned.placements()[group]
    assert "remat" in placements.values(), placements  # the squeezed budget forces a choice
    assert planned.policy(group) is not None
    assert planned.predicted.peak_device_bytes <= out["budget"]  # within the squeezed budget
    assert out["max_rel_grad_error"] <= 1e-6


@pytest.mark.slow  # the equinox example's compiles
def test_equinox_example_plans_and_keeps_the_gradients():
    pytest.importorskip(
        "equinox", reason="the Equinox example needs `pip install equinox` (tierax's test extra)"
    )
    # 0.8 of the own bytes beside XLA:GPU's fixed buffers (at 0.85 only the free mlpwo goes)
    out = _example("equinox_model").run(layers=4, d_model=64, seq=32, squeeze=0.8)
    planned, inv = out["planned"], out["inventory"]
    flops = {
        a.name: a.recompute_flops_per_layer for g in inv.inventory.groups for a in g.activations
    }
    assert flops["query_proj"] == 2 * 2 * 32 * 64 * 64  # 2 · batch · seq · d · d, from the shapes
    placements = planned.placements()["decoder"]
    # The squeezed budget forces recomputing something that costs FLOPs (mlpwo is free to
    # recompute).
    assert any(p == "remat" and flops[n] > 0 for n, p in placements.items()), placements
    assert planned.predicted.peak_device_bytes <= out["budget"]
    assert out["max_rel_grad_error"] <= 1e-6


def _layer(x, p):
    h = checkpoint_name(x @ p["w"], "mlpwi_0")
    return x + checkpoint_name(jnp.tanh(h) @ p["v"], "mlpwo")


def _loss(policy, layer=_layer):
    def loss(params, x):
        def body(c, p):
            return jax.checkpoint(layer, policy=policy, prevent_cse=False)(c, p), None

        y, _ = jax.lax.scan(body, x, params)
        return jnp.mean(y**2)

    return loss


PARAMS = {
    "w": jax.ShapeDtypeStruct((4, 64, 256), jnp.float32),
    "v": jax.ShapeDtypeStruct((4, 256, 64), jnp.float32),
}
X = jax.ShapeDtypeStruct((8, 32, 64), jnp.float32)


def test_inventory_finds_the_scanned_layer_and_the_policy_is_what_runs():
    inv = tierax.inventory(_loss(None), PARAMS, X)
    assert inv.groups == {"layers": ("mlpwi_0", "mlpwo")}
    (g,) = inv.inventory.groups
    assert g.num_layers == 4 and {a.name: a.bytes_per_layer for a in g.activations} == {
        "mlpwi_0": 8 * 32 * 256 * 4,
        "mlpwo": 8 * 32 * 64 * 4,
    }
    assert inv.inventory.param_bytes == 2 * 4 * 64 * 256 * 4
    free = tierax.plan(inv)
    assert (
        free.placements()["layers"]["mlpwi_0"] == "device"
    )  # everything fits (mlpwo is free to recompute)
    # Squeezed half a MiB at a time: the planner first recomputes what costs no matmul (mlpwo, the
    # unnamed tanh: 1 MiB back; jax 0.12's trace prices the tanh's HBM traffic, so the free plan
    # keeps it where 0.10.2's recomputed it already), then mlpwi_0.
    tight, budget = free, free.predicted.peak_device_bytes
    for _ in range(3):
        budget -= 2**19
        tight = tierax.plan(inv, budget=budget)
        if tight.placements()["layers"]["mlpwi_0"] == "remat":
            break
    assert tight.placements()["layers"]["mlpwi_0"] == "remat"
    assert tight.predicted.peak_device_bytes <= budget

    def grad_flops(policy):
        return jaxpr_tools.matmul_flops(jax.make_jaxpr(jax.grad(_loss(policy)))(PARAMS, X))

    # The planned policy is what executes: recomputing mlpwi_0 costs its matmul once more per layer.
    assert grad_flops(tight.policy("layers")) - grad_flops(
        jax.checkpoint_policies.everything_saveable
    ) == pytest.approx(4 * 2 * 8 * 32 * 64 * 256)


def test_mesh_splits_the_state_bytes():
    inv = tierax.inventory(_loss(None), PARAMS, X)
    one = tierax.plan(inv).predicted.breakdown.state_bytes
    eight = tierax.plan(inv, mesh={"fsdp": 8}).predicted.breakdown.state_bytes
    assert eight * 8 == one


def test_bad_input_is_named():
    with pytest.raises(TieraxError, match="no scan over a jax.checkpoint'ed layer"):
        tierax.inventory(lambda p, x: jnp.sum(x @ p["w"][0]), PARAMS, X)

    def reserved(x, p):
        return x + checkpoint_name(x @ p["w"] @ p["v"], "default")

    with pytest.raises(TieraxError, match="tags 'default', which a plan uses as its own key"):
        tierax.inventory(_loss(None, reserved), PARAMS, X)
    inv = tierax.inventory(_loss(None), PARAMS, X)
    with pytest.raises(TieraxError, match="no layer group 'decoder'; the model's groups: layers"):
        tierax.plan(inv).policy("decoder")
    with pytest.raises(TieraxError, match="mesh axes pipeline unknown"):
        tierax.plan(inv, mesh={"pipeline": 2})
    with pytest.raises(TieraxError, match="unknown target"):
        tierax.plan(inv, target="tpu")


def test_a_plan_that_keeps_everything_on_device_gives_a_policy_that_saves_everything():
    """policy() is never None: in the user's jax.checkpoint, policy=None recomputes everything."""

    def layer(x, p):  # one tagged name, costly to recompute: an ample budget keeps it on device
        return x + jnp.tanh(checkpoint_name(x @ p["w"], "mlpwi_0")) @ p["v"]

    inv = tierax.inventory(_loss(None, layer), PARAMS, X)
    planned = tierax.plan(inv)
    assert planned.placements() == {"layers": {"mlpwi_0": "device"}}

    def grad_flops(policy):
        return jaxpr_tools.matmul_flops(jax.make_jaxpr(jax.grad(_loss(policy, layer)))(PARAMS, X))

    saved = grad_flops(jax.checkpoint_policies.everything_saveable)
    assert grad_flops(planned.policy()) == grad_flops(planned.policy("layers")) == saved
    assert grad_flops(None) > saved  # what a None policy would have run


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"mesh": {"fsdp": 0}}, "mesh axis fsdp must be an integer ≥ 1, got 0"),
        ({"mesh": {"fsdp": -2}}, "mesh axis fsdp must be an integer ≥ 1, got -2"),
        ({"mesh": {"fsdp": 2.5}}, "mesh axis fsdp must be an integer ≥ 1, got 2.5"),
        ({"mesh": "fsdp=8"}, "give a mapping of axis sizes"),
        ({"budget": float("nan")}, "budget=nan: give a finite number of bytes"),
        ({"budget": -1.0}, "budget=-1.0: give a finite number of bytes"),
        ({"host_budget": float("inf")}, "host_budget=inf: give a finite number of bytes"),
        (
            {"extra_bytes": -(10**12)},
            "extra_bytes=-1000000000000: give a finite number of bytes ≥ 0",
        ),
    ],
)
def test_plan_refuses_bad_arguments_with_a_tierax_error(kwargs, fragment):
    inv = tierax.inventory(_loss(None), PARAMS, X)
    with pytest.raises(TieraxError) as e:
        tierax.plan(inv, **kwargs)
    assert fragment in str(e.value)


def test_inventory_and_plan_refuse_what_they_cannot_plan():
    with pytest.raises(TieraxError, match="takes what tierax.inventory"):
        tierax.plan({"a": 1})
    with pytest.raises(TieraxError, match=r"returns float32\[8, 32, 64\]; tierax plans the grad"):
        tierax.inventory(lambda p, x: _loss(None)(p, x) * jnp.ones_like(x), PARAMS, X)
    ints = {"w": jax.ShapeDtypeStruct((4, 64, 256), jnp.int32), "v": PARAMS["v"]}
    with pytest.raises(TieraxError, match=r"params leaves \['w'\] \(int32\) are not floating"):
        tierax.inventory(_loss(None), ints, X)
    with pytest.raises(TieraxError, match="loss_fn is a str"):
        tierax.inventory("loss", PARAMS, X)


def test_no_plan_fits_names_small_sizes_in_their_unit_and_the_apis_own_remedies():
    inv = tierax.inventory(_loss(None), PARAMS, X)
    with pytest.raises(TieraxError) as e:
        tierax.plan(inv, budget=1000)
    msg = str(e.value)
    # 2.81 MiB of the model's own beside XLA:GPU's fixed bytes (a whole number of MiB, by jaxlib
    # release: 6.81 MiB in all when they were 4 MiB)
    from gpu_budget import fixed_bytes

    need = 2.81 + fixed_bytes("h200") / 2**20
    assert (
        "no plan fits custom in a device budget of 1000 B: recomputing everything still needs "
        f"{need:.2f} MiB in a layer backward (params + grads + AdamW 2.00 MiB, layer inputs "
        "256.00 KiB"
    ) in msg, msg
    assert "--" not in msg and "a larger budget=" in msg, msg  # the API's terms, not the CLI's


# --- the user's own activation names ---------------------------------------------------------


def _own_layer(x, p):
    up = checkpoint_name(x @ p["w"], "my_up")
    return x + checkpoint_name(jnp.tanh(up) @ p["v"], "my_down")


def _recomputing_my_up(inv):
    """The plan of the largest budget (falling from the unconstrained peak, beside XLA:GPU's fixed
    buffers, which no plan moves) at which the planner recomputes my_up: the budget forces the
    choice whatever else the plan gives up first."""
    free = tierax.plan(inv).predicted
    fixed = free.breakdown.fixed_device_bytes
    for f in (0.999, 0.99, 0.98, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4):
        try:
            planned = tierax.plan(inv, budget=fixed + f * (free.peak_device_bytes - fixed))
        except TieraxError:
            break
        if planned.placements()["layers"]["my_up"] == "remat":
            return planned
    raise AssertionError("no budget makes the planner recompute my_up")


def test_the_api_plans_the_models_own_names():
    inv = tierax.inventory(_loss(None, _own_layer), PARAMS, X)
    assert inv.groups == {"layers": ("my_up", "my_down")}
    (g,) = inv.inventory.groups
    assert {a.name: a.bytes_per_layer for a in g.activations} == {
        "my_up": 8 * 32 * 256 * 4,  # b · s · f · 4 B
        "my_down": 8 * 32 * 64 * 4,
    }
    tight = _recomputing_my_up(inv)

    def grad_flops(policy):
        return jaxpr_tools.matmul_flops(
            jax.make_jaxpr(jax.grad(_loss(policy, _own_layer)))(PARAMS, X)
        )

    # Recomputing my_up costs its matmul (2 · b · s · d · f per layer) once more: the policy of
    # the user's names is what executes.
    assert grad_flops(tight.policy()) - grad_flops(
        jax.checkpoint_policies.everything_saveable
    ) == pytest.approx(4 * 2 * 8 * 32 * 64 * 256)


def test_a_kept_plan_in_the_models_names_round_trips_through_yaml_and_typos_are_refused(tmp_path):
    inv = tierax.inventory(_loss(None, _own_layer), PARAMS, X)
    tight = _recomputing_my_up(inv)
    path = tmp_path / "plan.yaml"
    path.write_text(tight.plan.to_yaml())
    assert "my_up: remat" in path.read_text()

    def grad_jaxpr(policy):
        return str(jax.make_jaxpr(jax.grad(_loss(policy, _own_layer)))(PARAMS, X))

    assert grad_jaxpr(tierax.api.policy(str(path), inv)) == grad_jaxpr(tight.policy())
    assert grad_jaxpr(tierax.api.policy(path, inv, "layers")) == grad_jaxpr(tight.policy())

    path.write_text(tight.plan.to_yaml().replace("my_up:", "my_upp:"))
    with pytest.raises(
        TieraxError,
        match=r"no activation 'my_upp' \(did you mean 'my_up'\?\); valid names "
        r"here: my_up, my_down",
    ):
        tierax.api.policy(str(path), inv)
    # A plan for tierax's prefetching scan (the default mechanism) is not what the user's scan runs.
    path.write_text("plan: p\ngroups:\n  layers:\n    my_up: offload\n")
    with pytest.raises(TieraxError, match="add 'mechanism: policy'"):
        tierax.api.policy(str(path), inv)
    path.write_text("plan: p\nmechanism: policy\ngroups:\n  layers:\n    my_up: offload\n")
    assert callable(tierax.api.policy(str(path), inv))
    with pytest.raises(TieraxError, match="takes what tierax.inventory"):
        tierax.api.policy(str(path), {"layers": 1})


def test_tierax_models_keep_the_closed_set_and_maxtext_refuses_foreign_names(tmp_path, cli):
    from tierax import plan as plan_lib
    from tierax.interop import maxtext
    from tierax.models import get_config

    text = "plan: mine\ngroups:\n  decoder:\n    my_up: offload\n    query_proj: device\n"
    plan = plan_lib.Plan.from_yaml(text)  # parses: names are the model's business
    with pytest.raises(
        TieraxError,
        match=r"has no activation 'my_up'; valid names here: "
        r"decoder_layer_input, query_proj",
    ):
        plan_lib.load_plan(plan, get_config("tiny-llama"))
    with pytest.raises(TieraxError, match=r"places 'my_up', which MaxText has no remat_policy key"):
        maxtext.overrides(plan, get_config("tiny-llama"), microbatch=1, seq=64, mesh={})
    f = tmp_path / "mine.yaml"
    f.write_text(text)
    r = cli("plans", "--model", "tiny-llama", "--show", f, "--emit", "maxtext")
    assert r.returncode == 2 and "'my_up', which MaxText has no remat_policy key" in r.stderr, r
    assert r.stdout == ""
    for bad in ("    7: offload\n", "    default: offlaod\n"):
        with pytest.raises(TieraxError):
            plan_lib.Plan.from_yaml("plan: p\ngroups:\n  decoder:\n" + bad)


def test_custom_names_example_plans_applies_and_keeps_the_gradients(tmp_path):
    out = _example("custom_names_model").run(
        layers=2, d_model=32, seq=16, squeeze=0.95, plan_out=tmp_path / "plan.yaml"
    )
    inv, planned = out["inventory"], out["planned"]
    assert inv.groups == {"decoder": ("qk_norm", "my_up", "my_down")}
    (g,) = inv.inventory.groups
    sizes = {a.name: a.bytes_per_layer for a in g.activations}
    # batch 2, seq 16, d 32 (4 heads × 8), mlp 256, float32; qk_norm tags q and k: two tensors.
    assert sizes == {
        "qk_norm": 2 * (2 * 16 * 32 * 4),
        "my_up": 2 * 16 * 256 * 4,
        "my_down": 2 * 16 * 32 * 4,
    }
    free = tierax.plan(inv).predicted.peak_device_bytes
    assert planned.predicted.peak_device_bytes <= out["budget"] < free  # it had to give up some
    assert "my_up" in (tmp_path / "plan.yaml").read_text()  # the plan file is in the model's names
    assert out["max_rel_grad_error"] <= 1e-6
