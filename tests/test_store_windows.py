"""A layer's stores hide only under the part of its forward that XLA:TPU's in-place carry leaves
them (tierax.costmodel.terms.store_window_s): a value made before the attention is stored in its
own layer, from its making to the layer's end; any other a layer later, from the next layer's start
to where that layer writes it again.

Checked four ways: the FLOPs before each name against a hand count (tracing), the rule against
XLA:TPU's own schedule in a deviceless compile (the matmul kernels between a deferred store's start
and its done are the ones before the value's producer), the planner's MILP against a brute force
that prices each store from first principles, and the rule's effect on the chip check's dense case
(an MLP up-projection's 16.9 ms store cannot hide under the 9 ms before it is made again)."""

from __future__ import annotations

import dataclasses
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_planner_bruteforce import (
    CFG,
    CODES,
    NAMES,
    PLACEMENT,
    check,
    fixture_groups,
    make_inventory,
    make_rates,
)

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as plan_lib
from tierax.models.attention import FUSED_SCOPE
from tierax.solving import planner
from tierax.tracing import jaxpr_tools
from tierax.tracing.model_program import for_inventory

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None

# --- the FLOPs before each name, by hand ------------------------------------------------------


def test_flops_before_names_by_hand():
    """a = x·W1 (made by the matmul), b = cast(a·W2) (made by the matmul, through a one-input
    cast), c = sin(b)·a (made by a two-input product where it stands), then a fused-scope matmul
    and a name after it."""
    n, d = 8, 16
    f1 = f2 = f3 = 2 * n * d * d

    def f(x, w1, w2, w3):
        a = jax.ad_checkpoint.checkpoint_name(x @ w1, "a")
        b = jax.ad_checkpoint.checkpoint_name((a @ w2).astype(jnp.bfloat16), "b")
        c = jax.ad_checkpoint.checkpoint_name(jnp.sin(b).astype(jnp.float32) * a, "c")
        with jax.named_scope(FUSED_SCOPE):
            e = c @ w3
        return jax.ad_checkpoint.checkpoint_name(e * 2, "e")

    s = jax.ShapeDtypeStruct
    j = jax.make_jaxpr(f)(s((n, d), jnp.float32), *[s((d, d), jnp.float32)] * 3)
    got = jaxpr_tools.flops_before_names(j, scope=FUSED_SCOPE)
    assert got["a"] == (f1, 0, 0, 0)
    assert got["b"] == (f1 + f2, 0, f1, 0)  # its matmul starts after a's
    assert got["c"] == (f1 + f2, 0, f1 + f2, 0)
    # e: made after the fused matmul, its producer (that matmul, through a scaling by a literal)
    # starting before it
    assert got["e"] == (f1 + f2 + f3, f3, f1 + f2, 0)


# --- the rule on a traced layer, by hand -------------------------------------------------------

SMALL = dict(d_model=256, mlp_dim=1024, num_heads=4, num_kv_heads=2, head_dim=64, num_layers=3)


@pytest.fixture(scope="module")
def small_dense():
    from tierax.models import apply_overrides, get_config
    from tierax.tracing.inventory import model_inventory

    cfg = apply_overrides(
        get_config("tiny-llama"), [f"{k}={v}" for k, v in SMALL.items()] + ["attention=xla"]
    )
    return cfg, model_inventory(cfg, 2, 128, {"data": 1, "fsdp": 1, "tensor": 1, "expert": 1})


def test_forward_flops_before_the_mlp_up_projections_by_hand(small_dense):
    """The MLP's up-projections follow q, k, v, the attention's two matmuls, the output projection
    (and, for mlpwi_1, mlpwi_0): their FLOPs from the shapes."""
    cfg, inv = small_dense
    t, d, h, kv, hd, m = 2 * 128, SMALL["d_model"], 4, 2, 64, SMALL["mlp_dim"]
    proj = 2 * t * d * (h + 2 * kv) * hd
    attention = 2 * (2 * 2 * 128 * 128 * h * hd)  # QKᵀ and PV, per sequence × 2 sequences
    out = 2 * t * h * hd * d
    wi = 2 * t * d * m
    a = {x.name: x for x in inv.groups[0].activations}
    assert a[N.MLPWI_0].flops_before_per_layer == proj + attention + out
    assert a[N.MLPWI_1].flops_before_per_layer == proj + attention + out + wi
    assert a[N.QUERY_PROJ].flops_made_per_layer == proj  # tagged after the three projections


def test_window_of_each_kind_of_store(small_dense):
    """A deferred store (mlpwi_1) hides under the forward before its producer; one in its own
    layer (query_proj) under the forward after its making; none is bounded without the TPU rule or
    under XLA's host offloader."""
    _, inv = small_dense
    g = inv.groups[0]
    a = {x.name: x for x in g.activations}
    rates = cm.target_rates("v5e", "bfloat16")
    assert rates.store_windows_by_name
    hb = rates.hbm_bytes_per_s
    F = g.forward_flops_per_layer
    share = g.matmul_min_dim_shares

    def upto(flops):  # attention=xla: no fused kernel
        return flops / rates.blended_matmul_rate(share) + g.forward_hbm_bytes_per_layer / hb * (
            flops / F
        )

    L = g.num_layers
    later = cm.terms.store_window_s(a[N.MLPWI_1], g, rates, "prefetch")
    assert later == pytest.approx(upto(a[N.MLPWI_1].flops_before_per_layer) * L, rel=1e-9)
    own = cm.terms.store_window_s(a[N.QUERY_PROJ], g, rates, "prefetch")
    assert own == pytest.approx((upto(F) - upto(a[N.QUERY_PROJ].flops_made_per_layer)) * L)
    assert 0 < later < own
    assert cm.terms.store_window_s(a[N.MLPWI_1], g, rates, "policy") == np.inf
    gpu = cm.target_rates("h100", "bfloat16")
    assert cm.terms.store_window_s(a[N.MLPWI_1], g, gpu, "prefetch") == np.inf


# --- XLA:TPU's own schedule -------------------------------------------------------------------


_COMPILE = r"""
import json, re, sys
from tierax import launch
launch.start_deviceless_tpu(accelerator_type="v5litepod-1")
from tierax.models import apply_overrides, get_config
from tierax.plan.types import Plan
from tierax.xla.compile import compile_for_target
cfg = apply_overrides(get_config("tiny-llama"), json.loads(sys.argv[1]))
plan = Plan.from_dict(json.loads(sys.argv[2]))
res, text = compile_for_target(cfg, plan, "v5e", microbatch=2, seq=128)
found = []
for body in re.split(r"\n(?=%|ENTRY)", text):
    lines = [ln for ln in body.split("\n")[1:] if ln.startswith(("  %", "  ROOT"))]
    for i, ln in enumerate(lines):
        m = re.match(r"\s*%([\w.-]+) = .*S\(5\).* dynamic-update-slice-start\(", ln)
        if not m:
            continue
        done = next(k for k in range(i, len(lines)) if f"-done(%{m.group(1)})" in lines[k])
        kernel = ["kind=kOutput" in b or 'custom_call_target="tpu_custom_call"' in b for b in lines]
        found.append([sum(kernel[:i]), sum(kernel[i + 1 : done]), sum(kernel[done + 1 :])])
print(json.dumps({"host_temp_bytes": res.to_json().get("host_temp_bytes"), "kernels": found}))
"""


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
def test_xla_tpu_ends_a_deferred_store_where_the_value_is_made_again(small_dense):
    """A deviceless v5e compile with mlpwi_1 offloaded: in the forward loop XLA:TPU starts the
    deferred store with the iteration (no matmul kernel before it) and waits for it before the two
    matmuls the model leaves out of its window — mlpwi_1's own and mlpwo's, the only kernels after
    the done; the window is the forward before mlpwi_1's producer."""
    import json
    import subprocess
    import sys

    sets = [f"{k}={v}" for k, v in SMALL.items()] + ["attention=xla"]
    plan = {"plan": "x", "groups": {"decoder": {"default": "remat", N.MLPWI_1: "offload"}}}
    p = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps(sets), json.dumps(plan)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["host_temp_bytes"] > 0
    _, inv = small_dense
    a = {x.name: x for x in inv.groups[0].activations}[N.MLPWI_1]
    F = inv.groups[0].forward_flops_per_layer
    # the model leaves out of the window exactly mlpwi_1's matmul and mlpwo's (two of the layer's
    # d·m FLOP matmuls), as XLA:TPU does
    t, d, m = 2 * 128, SMALL["d_model"], SMALL["mlp_dim"]
    assert F - a.flops_before_per_layer == 2 * (2 * t * d * m)
    assert len(got["kernels"]) == 1 and got["kernels"][0][0] == 0, got
    assert got["kernels"][0][1] >= 3 and got["kernels"][0][2] == 2, got


# --- the planner against a brute force ---------------------------------------------------------

# Where in its layer each fixture name is made: (FLOPs before its making, FLOPs before its producer
# starts), as shares of the group's forward FLOPs.  query_proj and key_proj (dense) and
# value_proj (moe) are stored in their own layer, the others a layer later.
ORDER = {
    "dense": ((0.1, 0.0), (0.2, 0.1), (0.6, 0.4), (1.0, 0.8)),
    "moe": ((0.15, 0.05), (0.35, 0.3), (0.7, 0.5), (0.9, 0.7)),
}


def windowed_inventory():
    inv = make_inventory(fixture_groups())
    groups = []
    for g in inv.groups:
        F = g.forward_flops_per_layer
        acts = [g.activations[0]] + [
            dataclasses.replace(a, flops_made_per_layer=m * F, flops_before_per_layer=b * F)
            for a, (m, b) in zip(g.activations[1:], ORDER[g.name], strict=True)
        ]
        groups.append(dataclasses.replace(g, activations=tuple(acts)))
    return dataclasses.replace(inv, groups=tuple(groups))


def windowed_seconds(inv, rates) -> np.ndarray:
    """Each plan's store seconds beyond what the rule lets hide, from first principles: per
    group, the larger of its stores beyond its forward and the sum of each store's excess over its
    own window (a value made before the attention: its layer's forward after its making; any other:
    the forward before its producer)."""
    mm, hbm = rates.matmul_flops_per_s, rates.hbm_bytes_per_s
    out = np.zeros(len(CODES))
    col = 0
    for g in inv.groups:
        L, F = g.num_layers, g.forward_flops_per_layer
        named = [a for a in g.activations if a.name != N.DECODER_LAYER_INPUT]
        c = CODES[:, col : col + len(named)]
        col += len(named)
        layer = F / mm + g.forward_hbm_bytes_per_layer / hbm

        def upto(flops, F=F, g=g):
            return flops / mm + g.forward_hbm_bytes_per_layer / hbm * flops / F

        own_excess = np.zeros(len(CODES))
        total = np.zeros(len(CODES))
        for j, a in enumerate(named):
            store = a.bytes_per_layer * L / rates.d2h_bytes_per_s
            if a.name in ("query_proj", "key_proj", "value_proj"):
                window = (layer - upto(a.flops_made_per_layer)) * L
            else:
                window = upto(a.flops_before_per_layer) * L
            on = c[:, j] == 1
            own_excess += on * max(0.0, store - window)
            total += on * store
        out += np.maximum(np.maximum(0.0, total - layer * L), own_excess)
    return out


def test_planner_with_store_windows_equals_brute_force(monkeypatch):
    """With per-name windows (a slow link, so stores outlast them), at budgets across the range
    the MILP's plan is the brute force's best and its step the brute force's, and the windows move
    the optimum somewhere."""
    import test_planner_bruteforce as bf

    inv = windowed_inventory()
    base = make_rates(link_d2h=3e9, link_h2d=8e9)
    rates = dataclasses.replace(base, store_windows_by_name=True)
    peak, host, plain = bf.brute_force(inv, base, "lhs", "prefetch")
    # the reference's stores hidden under the group's forward, replaced by the windowed rule
    group_only = np.zeros(len(CODES))
    col = 0
    for g in inv.groups:
        L = g.num_layers
        named = [a for a in g.activations if a.name != N.DECODER_LAYER_INPUT]
        c = CODES[:, col : col + len(named)]
        col += len(named)
        b = np.array([a.bytes_per_layer for a in named])
        store = ((c == 1) * b).sum(axis=1) * L / rates.d2h_bytes_per_s
        fwd = (
            g.forward_flops_per_layer / rates.matmul_flops_per_s
            + g.forward_hbm_bytes_per_layer / rates.hbm_bytes_per_s
        ) * L
        group_only += np.maximum(0.0, store - fwd)
    seconds = plain - group_only + windowed_seconds(inv, rates)
    assert (seconds > plain).any()
    changed = False
    for q in (0.1, 0.25, 0.4, 0.55, 0.7, 0.85):
        budget = int(peak.min() + q * (peak.max() - peak.min()))
        with monkeypatch.context() as mp:
            mp.setattr(bf, "brute_force", lambda *a, **k: (peak, host, seconds))
            codes, *_ = check(inv, rates, "lhs", budget, int(host.max()), "prefetch")
        free, *_ = check(inv, base, "lhs", budget, int(host.max()), "prefetch")
        changed |= not np.array_equal(codes, free)
    assert changed


def test_brute_force_reference_is_not_the_model():
    """The windowed reference prices a plan differently from the group-only rule (the fixture
    reaches the case: some store outlasts its own window while the group's forward hides the
    sum)."""
    inv = windowed_inventory()
    rates = dataclasses.replace(make_rates(link_d2h=3e9, link_h2d=8e9), store_windows_by_name=True)
    prog = for_inventory(CFG, inv)
    t = cm.linear_terms.build(prog, rates, "lhs", "prefetch", 1)
    excess = t.own_store_excess
    assert any(r.coef.any() for r in excess)
    k = next(
        i
        for i in range(len(CODES))
        if (CODES[i, :8] == 1).sum() == 1 and CODES[i, 6] == 1  # only moe_mlpwi_0 offloaded
    )
    placements = {
        (g, n): PLACEMENT[int(c)]
        for (g, n), c in zip(
            [(g, n) for g in ("dense", "moe") for n in NAMES[g]], CODES[k, :8], strict=True
        )
    } | {(g, planner.UNNAMED): plan_lib.Placement.REMAT for g in ("dense", "moe")}
    with_rule = cm.evaluate(placements, prog, rates, "lhs", "prefetch")
    without = cm.evaluate(
        placements, prog, dataclasses.replace(rates, store_windows_by_name=False), "lhs", "prefetch"
    )
    assert with_rule.breakdown.exposed_d2h_s > without.breakdown.exposed_d2h_s
    assert with_rule.breakdown.exposed_d2h_s == pytest.approx(windowed_seconds(inv, rates)[k])
