"""Cost-model terms an outside mutation audit found unchecked (issue 60), each against a hand
computation: the cuDNN backward workspace on a tensor-parallel mesh, the transposing-fusion term
where the unnamed intermediates are recomputed while every name is kept and where the layer input
itself is named, the offloaded accumulator's second host buffer, and exposed collectives under
gradient accumulation (once per microbatch)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name
from test_cpu_terms import RATES as CPU_RATES
from test_cpu_terms import A, B, _group, _inv
from test_planner_bruteforce import CFG as SYNTH_CFG
from test_planner_bruteforce import make_rates
from test_planner_state import PARAMS
from test_planner_state import inventory as state_inventory

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel.transposes import transpose_s
from tierax.mesh import MeshShape
from tierax.models import get_config
from tierax.plan import Placement
from tierax.solving import planner
from tierax.tracing import hbm
from tierax.tracing import inventory as inv_lib
from tierax.tracing.model_program import for_inventory

# --- the cuDNN backward workspace per device on a tensor-parallel mesh ----------------------------


def test_cudnn_workspace_on_a_tensor_mesh_counts_the_devices_own_heads():
    """tiny-llama (4 heads, head dim 16) with cuDNN attention on tensor=2: each device runs the
    backward kernel on its own 2 heads, so its workspace is 4·B·(H/t)·S·(d + 1) + 256 bytes
    (tierax.hardware.cudnn's formula, checked against XLA's sizes in tests/test_cudnn.py):
    4·2·2·128·17 + 256 = 35,072 bytes beside what the same inventory costs without the kernel."""
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16", attention="cudnn")
    rates = cm.target_rates("h200", cfg.dtype)
    plan = plan_lib.preset("save-all", cfg)
    for tensor, heads in ((1, 4), (2, 2)):
        mesh = MeshShape(tensor=tensor).to_dict()
        inv = inv_lib.model_inventory(cfg, 2, 128, mesh)
        fused = cm.simulate(plan, for_inventory(cfg, inv), rates, "lhs").breakdown.workspace_bytes
        plain_cfg = dataclasses.replace(cfg, attention="cudnn_blockwise")
        plain = cm.simulate(
            plan, for_inventory(plain_cfg, inv), rates, "lhs"
        ).breakdown.workspace_bytes
        assert fused - plain == 4 * 2 * heads * 128 * (16 + 1) + 256, tensor


# --- the transposing-fusion term (XLA:CPU) -------------------------------------------------------


def _placements(a, b, unnamed):
    return {("decoder", A): a, ("decoder", B): b, ("decoder", plan_lib.UNNAMED): unnamed}


@pytest.mark.parametrize(
    "a, b, ms",
    [
        # every name kept, the unnamed intermediates recomputed (a remat policy that saves both
        # names): the broadcasts 2, the carry 2, A 4, B 2 ms per layer — not the unnamed 3 ms.
        (Placement.DEVICE, Placement.DEVICE, 4 * (2 + 2 + 4 + 2)),
        (Placement.OFFLOAD, Placement.DEVICE, 4 * (2 + 2 + 4 + 2)),  # offloaded: kept on a CPU
    ],
)
def test_unnamed_recomputed_with_every_name_kept_reads_only_the_kept_names(a, b, ms):
    """(By hand, as tests/test_cpu_terms.py's table: spread reads at 1e9/s, aliased at 1e8/s.)"""
    got = transpose_s(_placements(a, b, Placement.REMAT), _inv([_group()]), CPU_RATES)
    assert got == pytest.approx(ms * 1e-3)
    # and with the unnamed intermediates kept too (no remat), every stack: 3 ms more per layer
    kept = transpose_s(_placements(a, b, Placement.DEVICE), _inv([_group()]), CPU_RATES)
    assert kept == pytest.approx((ms + 4 * 3) * 1e-3)


def test_the_named_layer_inputs_reads_count_once_with_the_carry():
    """The layer input is a named activation too (always kept): its reads, 5 ms a layer here, are
    the carry's — counted once under every plan, not again as a kept name."""
    g = _group()
    acts = tuple(
        dataclasses.replace(x, transposed_elems_per_layer=5e6)
        if x.name == N.DECODER_LAYER_INPUT
        else x
        for x in g.activations
    )
    inv = _inv([dataclasses.replace(g, activations=acts)])
    R, D = Placement.REMAT, Placement.DEVICE
    # remat of both names: broadcasts 2 + carry 2 + layer input 5 ms per layer
    assert transpose_s(_placements(R, R, R), inv, CPU_RATES) == pytest.approx(4 * 9e-3)
    # no remat: + unnamed 3 + A 4 + B 2
    assert transpose_s(_placements(D, D, D), inv, CPU_RATES) == pytest.approx(4 * 18e-3)


def test_a_named_layer_input_is_read_as_the_carry_not_as_a_name():
    """The traced layer tags its input (decoder_layer_input) — the same value as the scan's carry:
    a slow transposing fusion x·hx ([T, D] float32, hx a dot's result) reads it as the carry
    only, 2·T·D elements (x and hx), and no name gets a share."""
    T, D, F = 8, 16, 32
    wg = (((0,), (0,)), ((), ()))

    def step(x, wo, ct):
        x = checkpoint_name(x, N.DECODER_LAYER_INPUT)
        ct = hbm.marker(ct)
        hx = (ct @ wo.T) @ wo  # [T, D], a dot's result
        return jax.lax.dot_general(ct @ wo.T, x * hx, wg)

    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((T, D), (F, D), (T, D))]
    r = hbm.transposed_reads(jax.make_jaxpr(step)(*args), residual_inputs=1)
    none = {"always": 0.0, "residual": 0.0, "carry": 0.0, "named": {}}
    assert r == {"spread": none | {"carry": 2 * T * D}, "aliased": none}


# --- the offloaded accumulator's second host buffer ----------------------------------------------


def test_an_offloaded_accumulator_is_twice_on_the_host_while_it_is_added_to():
    """No activation or other state offloaded: the host holds the dense group's float32
    accumulator (4 bytes × its 20 M parameters per device) twice while a microbatch's gradients are
    added into it (tierax.costmodel.state's docstring; XLA's host temp of the accumulation)."""
    inv = state_inventory()
    rates = make_rates()
    free = planner.plan(for_inventory(SYNTH_CFG, inv), rates, mechanism="policy").plan
    plan = dataclasses.replace(free, state={"dense": {"grad_accum": "offload"}})
    pred = cm.simulate(plan, for_inventory(SYNTH_CFG, inv), rates, "lhs", grad_accum=2)
    assert pred.breakdown.activation_host_bytes == 0
    assert pred.host_bytes == 2 * 4 * PARAMS["dense"]
    # beside offloaded moments of the other group (8 bytes × 50 M), the larger of the two buffers
    both = dataclasses.replace(
        free, state={"dense": {"grad_accum": "offload"}, "moe": {"moments": "offload"}}
    )
    host = cm.simulate(both, for_inventory(SYNTH_CFG, inv), rates, "lhs", grad_accum=2).host_bytes
    assert host == 8 * PARAMS["moe"] + max(2 * 4 * PARAMS["dense"], 8 * PARAMS["moe"])


# --- exposed collectives under gradient accumulation ---------------------------------------------


def test_each_microbatch_waits_for_its_own_collectives():
    """tiny-llama on fsdp=2 over a slow 2 GB/s link (collectives exposed): with A = 3 microbatches
    per update every microbatch runs its forward and backward — FSDP gathers and gradient
    reduce-scatters included — so the step is 3 × (the one-microbatch step less the update's HBM
    time, 7 × the parameter bytes) + that update once + the float32 accumulations (A × N × 12
    bytes), all at the HBM rate."""
    cfg = get_config("tiny-llama")
    rates = cm.override_rates(cm.target_rates("h200", cfg.dtype), ["interconnect=2"])
    inv = inv_lib.model_inventory(cfg, 2, 64, MeshShape(fsdp=2).to_dict())
    plan = plan_lib.preset("save-all", cfg)
    one = cm.simulate(plan, for_inventory(cfg, inv), rates, "lhs")
    three = cm.simulate(plan, for_inventory(cfg, inv), rates, "lhs", grad_accum=3)
    assert one.breakdown.exposed_collective_s > 0.2 * one.step_time_s  # the case: exposed
    update = 7 * inv.param_bytes / rates.hbm_bytes_per_s
    adds = 3 * (inv.param_bytes / 4) * 12 / rates.hbm_bytes_per_s
    assert three.step_time_s == pytest.approx(3 * (one.step_time_s - update) + update + adds)
    assert three.split.collective_s == pytest.approx(3 * one.split.collective_s)
