"""``plan --max-microbatch --check`` with two microbatches refused (issue 60's audit gap): the
planner runs for real; the compile is replaced by a stand-in whose peak is the model's plus a
workspace of 2,000 bytes × microbatch² (a workspace that grows with the batch, as activations'
temporaries do), so the model's first answer is refused, a smaller one fits, one in between is
refused again, and the loop must keep the smaller refusal as its bound.

Brute force for the answer: the workspace does not depend on the placements, so a microbatch fits
exactly when the planner finds a plan for it within the budget less its workspace."""

from __future__ import annotations

import types

import compiled_standin
import pytest

from tierax import costmodel as cm
from tierax.mesh import MeshShape
from tierax.models import get_config
from tierax.solving import plan_check, planner
from tierax.tracing import inventory as inv_lib
from tierax.tracing.model_program import for_inventory
from tierax.xla import compile as compile_lib

# tiny-llama, seq 64, H200 rates: the model's largest microbatch is in the 40s — XLA:GPU's fixed
# bytes (the cuBLAS workspace, by jaxlib release) plus 25.8 MB of the model's own (30 MB in all
# when the workspace was 4 MiB)
BUDGET = cm.target_rates("h200", get_config("tiny-llama").dtype).fixed_device_bytes + 25_805_696
SEQ = 64


def workspace(mb: int, c: int = 2000) -> int:
    return c * mb * mb


@pytest.fixture
def setting(monkeypatch):
    cfg = get_config("tiny-llama")
    rates = cm.target_rates("h200", cfg.dtype)
    invs: dict = {}

    def inv(mb):
        if mb not in invs:
            invs[mb] = inv_lib.model_inventory(cfg, mb, SEQ, MeshShape().to_dict())
        return invs[mb]

    def xla(cfg, plan, target, *, microbatch, seq, mesh, grad_accum=1):
        peak = cm.simulate(
            plan, for_inventory(cfg, inv(microbatch)), rates, "lhs"
        ).peak_device_bytes
        return compiled_standin.compiled(peak + workspace(microbatch, s.c))

    monkeypatch.setattr(compile_lib, "compile_for_target", xla)
    s = types.SimpleNamespace(cfg=cfg, rates=rates, inv=inv, c=2000)
    return s


def _fits(s, mb: int) -> bool:
    try:
        planner.plan(
            for_inventory(s.cfg, s.inv(mb)), s.rates, budget_bytes=BUDGET - workspace(mb, s.c)
        )
    except planner.NoPlanFits:
        return False
    return True


def test_two_refused_microbatches_bound_the_answer_from_above(setting):
    res = plan_check.max_microbatch_check(
        setting.cfg, MeshShape(), setting.rates, "h200", seq=SEQ, budget_bytes=BUDGET
    )
    mbs = [s.microbatch for s in res.steps]
    refused = [s.microbatch for s in res.steps if not s.xla_fits]
    assert len(refused) == 2 and refused[1] < refused[0]  # the case: a second, smaller refusal
    assert len(set(mbs)) == len(mbs)  # no microbatch compiled twice
    assert res.converged and res.result is not None
    best = res.result.microbatch
    # the boundary, brute force: the answer fits, one more does not; the smaller refusal is it
    assert _fits(setting, best) and not _fits(setting, best + 1)
    assert min(refused) == best + 1
    for s in res.steps:  # each verdict is the stand-in's, each peak the model's plus workspace
        assert s.xla_fits == (s.xla_peak_bytes <= BUDGET)
        assert s.xla_peak_bytes == s.predicted_peak_bytes + workspace(s.microbatch)
    _bracketed(res.steps)


def _bracketed(steps):
    """Each compile lies above every earlier fit and below every earlier refusal."""
    for k, s in enumerate(steps):
        assert all(s.microbatch > e.microbatch for e in steps[:k] if e.xla_fits), k
        assert all(s.microbatch < e.microbatch for e in steps[:k] if not e.xla_fits), k


def test_refusals_above_fits_keep_the_bracket_without_converging(setting):
    """A workspace 5× steeper: the model swings between far too large and far too small (45
    refused, 7 fits, 44 refused, 8 fits, …); within 6 compiles it has not closed the bracket and
    says so, every compile inside the bracket the earlier ones set, none repeated, its answer a
    microbatch that fits (brute force)."""
    setting.c = 10_000
    res = plan_check.max_microbatch_check(
        setting.cfg,
        MeshShape(),
        setting.rates,
        "h200",
        seq=SEQ,
        budget_bytes=BUDGET,
        max_compiles=6,
    )
    assert len(res.steps) == 6 and sum(not s.xla_fits for s in res.steps) >= 3
    _bracketed(res.steps)
    assert not res.converged and _fits(setting, res.result.microbatch)


def test_a_correction_above_the_whole_budget_bisects_instead_of_failing(setting):
    """A workspace so steep (20,000 bytes × mb² at a 30 MB budget, in proportion to the budget)
    that XLA's miss at the model's first answer exceeds the whole budget: the corrected model has
    no budget left, so the loop solves the bracket's microbatches at the budget itself (it used to
    stop on 'device budget -10500000') and ends on one that fits (brute force), every compile
    inside the bracket."""
    setting.c = round(20_000 * BUDGET / 30e6)
    res = plan_check.max_microbatch_check(
        setting.cfg, MeshShape(), setting.rates, "h200", seq=SEQ, budget_bytes=BUDGET
    )
    first = res.steps[0]
    assert not first.xla_fits and first.xla_peak_bytes - first.predicted_peak_bytes > BUDGET
    _bracketed(res.steps)
    assert res.result is not None and _fits(setting, res.result.microbatch)
