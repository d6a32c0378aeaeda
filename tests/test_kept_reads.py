"""tierax.costmodel.kept_reads: on a TPU a layer's backward reads the names the plan keeps on device
from their saved stacks, so its layer phase counts them once (in the kept activations), not again
in the workspace; the loss phase keeps them all.  Checked by hand on a hand-made layer (which names
are written values themselves) and on the planner's synthetic two-group inventory
(tests/test_planner_bruteforce.py) on a TPU target, and the MILP's rows against evaluate on it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import maxtext_cli as M
import pytest
from jax.ad_checkpoint import checkpoint_name
from test_linear_terms import check_every_plan, placements_of
from test_planner_bruteforce import CFG, CODES, fixture_groups, make_inventory
from test_planner_bruteforce import make_rates as bruteforce_rates

from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel import linear_terms, predict
from tierax.tracing import hbm, model_program

MB = 2**20
P = plan_lib.Placement


def test_written_residuals_name_the_values_written_themselves():
    """A matmul's output (and it reshaped) is written itself; a value made elementwise from two
    others, one cast wider than its matmul's output, or one the backward does not need, is not."""
    b, d, f = 8, 16, 32

    def layer(x, p):
        a = checkpoint_name(x @ p["wi0"], N.MLPWI_0)
        g = checkpoint_name((x @ p["wi1"]).reshape(b, 2, f // 2), N.MLPWI_1).reshape(b, f)
        q = checkpoint_name((x @ p["wq"]) * (x @ p["wq2"]), N.QUERY_PROJ)  # of two GEMMs
        k = checkpoint_name((x @ p["wk"]).astype(jnp.float32), N.KEY_PROJ)  # wider than its GEMM
        h = jax.nn.silu(a) * g
        return x + checkpoint_name(h @ p["wo"], N.MLPWO) + q * q + (k * k).astype(x.dtype)

    x = jax.ShapeDtypeStruct((b, d), jnp.bfloat16)
    shapes = {"wi0": (d, f), "wi1": (d, f), "wq": (d, d), "wq2": (d, d), "wk": (d, d), "wo": (f, d)}
    p = {n: jax.ShapeDtypeStruct(s, jnp.bfloat16) for n, s in shapes.items()}
    assert hbm.written_residuals(layer, x, p)[2] == {N.MLPWI_0, N.MLPWI_1}


READ = {("dense", N.MLPWI_0), ("moe", N.MOE_MLPWI_0), ("moe", N.MOE_MLPWI_1)}
WRITTEN = {"dense": 120 * MB, "moe": 250 * MB}  # each group's written residuals per layer


def tpu_program(target: str = "v5p"):
    """The synthetic inventory with READ's names read in place and WRITTEN's residuals, and rates
    for ``target``."""
    inv = make_inventory(fixture_groups())
    groups = tuple(
        dataclasses.replace(
            g,
            activations=tuple(
                dataclasses.replace(a, read_in_place=(g.name, a.name) in READ)
                for a in g.activations
            ),
            written_residual_bytes_per_layer=WRITTEN[g.name],
        )
        for g in inv.groups
    )
    inv = dataclasses.replace(inv, groups=groups)
    return model_program.for_inventory(CFG, inv), dataclasses.replace(
        bruteforce_rates(), target=target
    )


def every(where):
    """Placements: every name at ``where`` (the unnamed intermediates recomputed)."""
    return placements_of((where,) * 8 + (0, 0))


def test_layer_phase_by_hand_on_a_tpu():
    prog, rates = tpu_program()
    t = linear_terms.build(prog, rates, "lhs")
    fx = t.fixed
    assert not prog.moe_backward_bytes and fx.late_grad_bytes == 0 and not fx.after_backward_bytes
    state = (300 + 300 + 600) * MB
    stacks = 4 * 1000 * (3 + 5)  # XLA:TPU's compute-dtype (float32) copies, 1000 per layer
    assert fx.stack_copy_bytes == stacks
    assert dict(fx.group_workspace_bytes) == WRITTEN  # one device: no gathered weights
    # every name kept: carries 3·8 + 5·8, dense 3 × (32+16+48+8), MoE 5 × (16+24+96+96)
    kept = (24 + 40 + 3 * 104 + 5 * 232) * MB
    b = predict.evaluate_terms(t, every(0), None, prog).breakdown
    assert b.activation_bytes == kept
    dense = state + 120 * MB + stacks + kept - 48 * MB  # mlpwi_0 read from its stack
    moe = state + 250 * MB + stacks + kept - (96 + 96) * MB  # both up-projections
    assert b.layer_phase_bytes == max(dense, moe) == dense
    assert b.loss_phase_bytes == fx.loss_phase_bytes + kept  # the loss holds every stack
    assert b.peak_phase == ("loss" if fx.loss_phase_bytes + kept > dense else "layer backward")
    # the rule's effect: the largest workspace less its group's reads would be moe
    assert dense > moe and state + 250 * MB + stacks + kept > dense
    # every name recomputed: only the carries kept, nothing read; the largest workspace
    b = predict.evaluate_terms(t, every(2), None, prog).breakdown
    assert b.layer_phase_bytes == state + 250 * MB + stacks + 64 * MB
    # offloaded names are not kept on device: nothing read in place (their staging instead)
    b = predict.evaluate_terms(t, every(1), None, prog).breakdown
    assert b.layer_phase_bytes == state + 250 * MB + stacks + 64 * MB + b.staging_bytes


def test_other_targets_keep_one_microbatch_row():
    """A GPU or CPU target holds every residual: no kept reads, the single row of before."""
    prog, rates = tpu_program(target="h100")
    t = linear_terms.build(prog, rates, "lhs")
    assert t.kept_read_bytes == ()
    ((label, row),) = t.microbatch_phase_rows()
    assert label == "microbatch phases" and row.const == t.microbatch_phase_bytes.const
    assert (row.coef == t.microbatch_phase_bytes.coef).all()


def test_milp_equals_evaluate_with_kept_reads():
    """The planner's MILP reads each group's layer row and the loss row: at every 13th plan of the
    brute-force enumeration its peak is evaluate's (tests/test_linear_terms.py's check)."""
    prog, rates = tpu_program()
    plans = [(placements_of(code), None) for code in CODES[::13]]
    preds = check_every_plan(prog, rates, "lhs", "policy", plans)
    # the enumeration reaches both groups' layer rows and the loss as the peak
    assert {p.breakdown.peak_phase for p in preds} >= {"layer backward"}
    assert len({p.peak_device_bytes for p in preds}) > 50


# slow: a trace of MaxText's layer (about 15 s here); the default tests above cover the rule on a
# hand-made layer's names and the planner's inventory.
@pytest.mark.slow
@M.requires_maxtext
def test_maxtext_minimal_policy_reads_its_matmul_outputs_in_place():
    """MaxText's tiny llama2 block under ``remat_policy=minimal`` on 4 v5p (1 × 32 tokens a
    device): of the names the policy keeps, the value, output and both MLP input projections are
    matmul outputs (read in place); the query and key are rotated by RoPE after theirs (not).  The
    layer phase is the workspace's less those four per layer, by hand from the shapes (bf16)."""
    from tierax import costmodel as cm
    from tierax.interop.maxtext_program import program

    tokens = 32
    run = program(
        M.base_yml(),
        [*M.TINY, "remat_policy=minimal"],
        target="v5p",
        devices=4,
        microbatch=1,
        seq=tokens,
    )
    prog, plan = run.program, run.plan
    (g,) = prog.inventory.groups
    kept = {a.name for a in g.activations if plan.groups[g.name].placement(a.name) is P.DEVICE}
    read = {a.name for a in g.activations if a.read_in_place} & kept - {N.DECODER_LAYER_INPUT}
    assert read == {N.VALUE_PROJ, N.OUT_PROJ, N.MLPWI_0, N.MLPWI_1}
    assert {N.QUERY_PROJ, N.KEY_PROJ} <= kept
    rates = cm.target_rates("v5p", prog.dtype)
    b = cm.simulate(plan, prog, rates, "lhs", 1).breakdown
    fx = linear_terms.build(prog, rates, "lhs").fixed
    by_hand = 2 * tokens * (M.KV * M.HD + M.D + 2 * M.MLP)  # v, out_proj, mlpwi_0, mlpwi_1
    before = fx.layer_backward_bytes(fx.workspace_bytes) + b.activation_bytes + b.staging_bytes
    after = fx.after_backward_bytes + b.activation_bytes
    assert b.layer_phase_bytes == max(before - by_hand, after)
