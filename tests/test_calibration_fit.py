"""The calibration from measured runs (tierax.calibration): the step split by resource against the
model's own response to a rate, the least-squares factors against a hand computation (numpy's
linear least squares on the split, where the step is linear in the factors), known factors
recovered, and leave-one-out by brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tierax import costmodel as cm
from tierax.calibration import fit as F
from tierax.calibration import runs as R

# One h100 (no collectives), nothing offloaded (no exposed copies): the step is gemm + memory
# (+ attention where fused), linear in the factors; tiny-llama's steps are mostly memory time,
# llama3.1-8b's mostly GEMM time, so the two factors are well determined.
SHAPES = [
    ("tiny-llama", "save-all", 8, 32),
    ("tiny-llama", "remat-full", 1, 1024),
    ("llama3.1-8b", "save-all", 1, 256),
    ("llama3.1-8b", "remat-full", 2, 1024),
]


@pytest.fixture(scope="module")
def prepared():
    from tierax import launch

    launch.start()
    out = []
    for i, (model, plan, mb, seq) in enumerate(SHAPES):
        run = R.Run(
            name=f"r{i}",
            target="h100",
            model_key="model",
            model=model,
            mesh={"fsdp": 1},
            microbatch=mb,
            seq=seq,
            measured_s=1.0,
            plan=plan,
        )
        out.append(R.prepare(run, calibration={}))
    return out


def _measured(prepared, seconds):
    """The prepared runs with measured times ``seconds`` (same traces)."""
    import dataclasses

    return [
        dataclasses.replace(p, run=p.run.with_measured(s, "test"), _cache={})
        for p, s in zip(prepared, seconds, strict=True)
    ]


def test_the_split_sums_to_the_step_and_each_linear_factor_moves_it_by_its_seconds(prepared):
    for p in prepared:
        pred = p.predict()
        s = pred.split
        assert s.collective_s == 0 and s.other_s == 0  # one device, nothing offloaded
        assert s.total_s == pytest.approx(pred.step_time_s, rel=1e-12)
        for resource in ("gemm", "memory", "attention"):
            if resource != "attention":
                assert s.seconds(resource) > 0
            moved = p.step_s({resource: 1.7}) - pred.step_time_s
            assert moved == pytest.approx(0.7 * s.seconds(resource), rel=1e-9)


def _hand_fit(prepared, measured, names):
    """Linear least squares on relative errors, by numpy: columns = each resource's seconds over
    the measured time, right side = 1 − the rest over the measured time."""
    a = np.array(
        [
            [p.predict().split.seconds(n) / m for n in names]
            for p, m in zip(prepared, measured, strict=True)
        ]
    )
    rest = np.array(
        [
            (p.step_s() - sum(p.predict().split.seconds(n) for n in names)) / m
            for p, m in zip(prepared, measured, strict=True)
        ]
    )
    x, *_ = np.linalg.lstsq(a, 1 - rest, rcond=None)
    return dict(zip(names, x, strict=True))


def test_fit_recovers_known_factors_and_matches_the_hand_least_squares(prepared):
    true = {"gemm": 1.31, "memory": 0.83}
    exact = _measured(prepared, [p.step_s(true) for p in prepared])
    got, clamped = F.fit_factors(exact, ("gemm", "memory"))
    assert clamped == ()
    assert got["gemm"] == pytest.approx(1.31, rel=1e-6)
    assert got["memory"] == pytest.approx(0.83, rel=1e-6)
    # measured times off the model by known amounts: the least-squares answer, by hand
    noisy = [
        p.step_s(true) * (1 + e) for p, e in zip(prepared, (0.05, -0.03, 0.02, -0.06), strict=True)
    ]
    runs = _measured(prepared, noisy)
    got, _ = F.fit_factors(runs, ("gemm", "memory"))
    hand = _hand_fit(prepared, noisy, ("gemm", "memory"))
    assert got["gemm"] == pytest.approx(hand["gemm"], rel=1e-6)
    assert got["memory"] == pytest.approx(hand["memory"], rel=1e-6)


def test_a_factor_stops_at_the_bound_and_is_reported(prepared):
    runs = _measured(prepared, [p.step_s() * 10 for p in prepared])  # needs ~10x: above 4
    got, clamped = F.fit_factors(runs, ("gemm",))
    assert clamped == ("gemm",) and got["gemm"] == pytest.approx(F.BOUNDS[1])


def test_leave_one_out_by_brute_force(prepared):
    true = {"gemm": 1.2, "memory": 1.5}
    noisy = [
        p.step_s(true) * (1 + e) for p, e in zip(prepared, (0.04, -0.05, 0.01, 0.03), strict=True)
    ]
    runs = _measured(prepared, noisy)
    g = F.fit_group("h100", runs, ("gemm", "memory"))
    for i, p in enumerate(runs):
        others = [o for j, o in enumerate(prepared) if j != i]
        hand = _hand_fit(others, [m for j, m in enumerate(noisy) if j != i], ("gemm", "memory"))
        e = g.errors[p.run.name]
        assert e.loo_s == pytest.approx(p.step_s(hand), rel=1e-6)
        assert e.uncalibrated_s == pytest.approx(p.step_s(), rel=1e-12)
        assert e.measured_s == noisy[i]
    # the fitted factors are the hand fit on every run
    hand = _hand_fit(prepared, noisy, ("gemm", "memory"))
    assert g.factors["gemm"] == pytest.approx(hand["gemm"], rel=1e-6)


def test_automatic_factors_take_the_subset_with_the_smallest_leave_one_out(prepared):
    noisy = [
        p.step_s({"gemm": 1.4}) * (1 + e)
        for p, e in zip(prepared, (0.01, -0.01, 0.0, 0.02), strict=True)
    ]
    runs = _measured(prepared, noisy)
    g = F.auto_group("h100", runs)
    tried = dict(g.tried)
    used = F.used_resources(runs)
    assert set(used) == {"gemm", "memory", "attention"}  # llama3.1-8b: cuDNN attention
    assert ("gemm",) in tried and len(tried) == 7  # every non-empty subset of three
    best = min(tried.values())
    assert g.factor_set().median_abs_error("loo") == pytest.approx(best)
    assert tried[g.factor_names] == best


def test_automatic_factors_pass_over_a_subset_whose_fit_stops_at_a_bound(prepared):
    # attention truly 30 (above the bound 4): every subset fitting attention clamps it, and such
    # a subset (the least-squares minimum outside the range: its factor stands in for another
    # term) is not chosen, though its leave-one-out error is the smallest
    noisy = [
        p.step_s({"attention": 30.0}) * (1 + e)
        for p, e in zip(prepared, (0.01, -0.01, 0.0, 0.02), strict=True)
    ]
    runs = _measured(prepared, noisy)
    g = F.auto_group("h100", runs)
    tried = dict(g.tried)
    clamped = {n for n in tried if F.fit_group("h100", runs, n).clamped}
    assert clamped and all("attention" in n for n in clamped)
    assert min(tried[n] for n in clamped) < min(tried[n] for n in tried if n not in clamped)
    assert g.clamped == () and g.factor_names not in clamped
    assert tried[g.factor_names] == min(tried[n] for n in tried if n not in clamped)


def test_refused_groups(prepared):
    runs = _measured(prepared[:2], [1.0, 1.0])
    with pytest.raises(Exception, match="at least one run more than its factors"):
        F.fit_group("h100", runs, ("gemm", "memory"))
    with pytest.raises(Exception, match="no run spends predicted time on collectives"):
        F.fit_group("h100", _measured(prepared, [1.0] * 4), ("gemm", "collectives"))
    # exact for three runs, one measured at 2x: the leave-one-out median is worse than none
    exact = [p.step_s() for p in prepared[:3]] + [2 * prepared[3].step_s()]
    g = F.fit_group("h100", _measured(prepared, exact), ("gemm",))
    assert F.problems([g]) and "worse than the uncalibrated" in F.problems([g])[0]


def test_scale_rates_refuses_bad_factors():
    from tierax.errors import TieraxError

    rates = cm.target_rates("h100", "bfloat16", {})
    with pytest.raises(TieraxError, match="unknown resource"):
        cm.scale_rates(rates, {"flops": 1.2})
    with pytest.raises(TieraxError, match="finite number > 0"):
        cm.scale_rates(rates, {"gemm": 0.0})
    scaled = cm.scale_rates(rates, {"gemm": 2.0, "collectives": 4.0})
    assert scaled.matmul_flops_per_s == rates.matmul_flops_per_s / 2
    assert scaled.fp8_matmul_flops_per_s == rates.fp8_matmul_flops_per_s / 2
    assert scaled.interconnect_bytes_per_s == rates.interconnect_bytes_per_s / 4
    assert scaled.scale_out_bytes_per_s == rates.scale_out_bytes_per_s / 4
    assert scaled.hbm_bytes_per_s == rates.hbm_bytes_per_s


def test_a_full_prediction_cache_keeps_the_new_prediction_and_the_program(prepared, monkeypatch):
    """A fit evaluates more factor sets than a prepared run keeps: when the cache fills, the
    predictions are dropped, the one just made is returned and kept, and the traced program is
    not traced again (a fit of the published runs once failed with a KeyError here)."""
    import dataclasses

    monkeypatch.setattr(R, "PREDICTIONS_KEPT", 3)
    p = dataclasses.replace(prepared[0], _cache={})
    program = p.program
    steps = [p.step_s({"gemm": f}) for f in (1.0, 1.5, 2.0, 2.5, 3.0)]
    assert steps == sorted(steps) and len(set(steps)) == 5  # each its own prediction
    assert p.program is program
    assert len(p._cache) <= 3 and p.step_s({"gemm": 3.0}) == steps[-1]
    fresh = dataclasses.replace(prepared[0], _cache={})
    assert fresh.step_s({"gemm": 1.5}) == steps[1]  # what the cache returned is the model's
