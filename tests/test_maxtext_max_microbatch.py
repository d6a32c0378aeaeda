"""``tierax plan --maxtext ... --max-microbatch``: the largest per_device_batch_size whose MaxText
program the model fits a plan of, found by :func:`tierax.solving.planner.largest_fitting`'s doubling
and bisection over MaxText's program retraced at each batch
(:class:`tierax.solving.maxtext_check.BatchSearch`).

The search is checked against brute force: the model's fit at every batch, computed here by the
planner on each batch's own trace; the shared search against every threshold of a monotone
predicate.  MaxText's compiles of the answer (``--check``) are run by
``bench/estimator_maxtext.py``, not here (minutes a compile).
"""

from __future__ import annotations

import maxtext_cli as M
import pytest

from tierax.interop.maxtext_program.config import maxtext_importable
from tierax.solving import planner

MIB = 2**20


@pytest.mark.parametrize("bound", [0, 1, 2, 3, 7, 8, 9, 40])
def test_largest_fitting_against_every_threshold(bound):
    """Every monotone predicate on 1..50 (fits below a threshold): the answer is brute force's,
    no microbatch is asked twice, and none above ``bound``."""
    for threshold in range(0, 51):
        asked: list[int] = []

        def fits(mb: int, t=threshold, asked=asked) -> bool:
            asked.append(mb)
            return mb <= t

        expected = max((mb for mb in range(1, bound + 1) if mb <= threshold), default=0)
        assert planner.largest_fitting(fits, bound) == expected, (threshold, bound)
        assert len(asked) == len(set(asked)), asked
        assert all(1 <= mb <= bound for mb in asked), asked


maxtext = pytest.mark.skipif(
    not maxtext_importable(),
    reason="MaxText is not installed (make venv installs it on Python >= 3.12)",
)

TINY = M.TINY  # d 256, 4 query / 2 kv heads of 64, MLP 512, 2 layers, vocab 1024
SEQ, DEVICES = 1024, 4
# A device budget between the model's least peaks at microbatch 3 and 4 of TINY at SEQ on 4 v5p
# (the test asserts the brute force's answer is 3, so a budget that drifts off is caught).
BUDGET = 37 * MIB
LARGEST = 3


@pytest.fixture(scope="module")
def traced():
    """TINY's MaxText program at microbatches 1..LARGEST+1 (each traced once, on demand) and the
    number of times each was traced."""
    from tierax import launch
    from tierax.interop.maxtext_program import program

    launch.start()
    runs: dict[int, object] = {}
    calls: dict[int, int] = {}

    def trace(mb: int):
        calls[mb] = calls.get(mb, 0) + 1
        if mb not in runs:
            runs[mb] = program(
                M.base_yml(), TINY, target="v5p", devices=DEVICES, microbatch=mb, seq=SEQ
            )
        return runs[mb]

    return trace, calls


def _request(run, budget):
    from tierax import costmodel as cm
    from tierax.solving import planning

    rates = cm.target_rates("v5p", run.program.dtype)
    return planning.Request(
        None,
        run.mesh,
        rates,
        microbatch=run.program.microbatch,
        seq=SEQ,
        budget_bytes=budget,
        for_tool="maxtext",
        place_state=False,
        program=run.program,
    )


def _fits_by_hand(run, rates, budget) -> bool:
    """The model's fit of one batch, asked of the planner directly (one placement per name, XLA's
    offload policy, the state on device: what MaxText runs)."""
    try:
        planner.plan(
            run.program,
            rates,
            schedule="lhs",
            budget_bytes=budget,
            one_placement_per_name=True,
            mechanism="policy",
            place_state=False,
        )
    except planner.NoPlanFits:
        return False
    return True


@maxtext
@pytest.mark.slow  # five MaxText traces, seconds each; the default suite checks the search above
def test_search_against_brute_force(traced):
    from tierax.solving import maxtext_check

    trace, calls = traced
    req = _request(trace(1), BUDGET)
    calls.clear()
    search = maxtext_check.BatchSearch(req, trace)
    found = search.largest()
    # each microbatch the search asked for was traced once
    assert all(n == 1 for n in calls.values()), calls
    assert search.traces == len(calls)
    asked = dict(calls)
    # brute force: the model's fit at every batch 1..LARGEST+1, by the planner directly
    brute = [_fits_by_hand(trace(mb), req.rates, BUDGET) for mb in range(1, LARGEST + 2)]
    assert brute == [True] * LARGEST + [False], brute
    assert found == LARGEST
    # a compile's miss lowers the budget: the answer is brute force's at the budget less the miss
    miss = 10 * MIB
    brute_less = [_fits_by_hand(trace(mb), req.rates, BUDGET - miss) for mb in (1, 2, 3)]
    expected = max((mb for mb, ok in zip((1, 2, 3), brute_less, strict=True) if ok), default=0)
    assert 0 < expected < LARGEST, brute_less
    assert search.largest(miss) == expected
    # below: the largest under a batch MaxText refused
    assert search.largest(below=LARGEST) == LARGEST - 1
    # the searches after the first traced nothing again (the search's own count)
    assert search.traces == len(asked)


def _main(argv):
    from tierax import cli

    return cli.main(argv)


@maxtext
@pytest.mark.parametrize(
    "extra, needle",
    [
        (["per_device_batch_size=2"], "per_device_batch_size=2 would be ignored"),
        (["--microbatch", "2"], "--microbatch 2 would be ignored"),
        (["--segments"], "--segments"),
    ],
)
def test_refused_before_any_work_exit_2(extra, needle, capsys, tmp_path):
    out = tmp_path / "plan.yml"
    keys = [e for e in extra if "=" in e and not e.startswith("-")]
    flags = [e for e in extra if e not in keys]
    argv = ["plan", "--maxtext", M.base_yml(), *TINY, *keys, "--target", "v5p", "--devices", "4"]
    argv += ["--max-microbatch", "--emit", "maxtext", "--out", str(out), *flags]
    assert _main(argv) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


@maxtext
def test_no_batch_fits_exit_2(capsys, tmp_path):
    """A 4 MiB device budget, in which the model fits no plan of TINY even at batch 1: exit 2 with
    the planner's message of what does not fit, nothing written."""
    out = tmp_path / "plan.yml"
    argv = ["plan", "--maxtext", M.base_yml(), *TINY, f"max_target_length={SEQ}"]
    argv += ["--target", "v5p", "--devices", str(DEVICES), "--budget-gib", f"{4 * MIB / 2**30}"]
    argv += ["--max-microbatch", "--emit", "maxtext", "--out", str(out), "--no-check"]
    assert _main(argv) == 2
    err = capsys.readouterr().err
    assert "no plan fits" in err and "microbatch 1" in err, err[-2000:]
    assert not out.exists()


@maxtext
@pytest.mark.slow  # shares the brute-force test's traces
def test_check_batch_corrections_by_hand(traced):
    """check_batch's arithmetic, its compile a stand-in with the peak chosen here: a negative
    correction lets the model's peak pass the budget by that much; a compile above the budget is
    followed by a solve at the budget less that compile's miss, and a fit within 5 % converges."""
    import compiled_standin

    from tierax.solving import maxtext_check

    trace, _ = traced
    run = trace(LARGEST + 1)
    req = _request(run, BUDGET)
    solved, peaks = [], [BUDGET + 2 * MIB, BUDGET - 1 * MIB]

    def compile_plan(result):
        solved.append(result)
        return compiled_standin.compiled(peaks[len(solved) - 1])[0]

    # batch LARGEST+1 does not fit BUDGET by the model: with -20 MiB it is solved at BUDGET+20
    res = maxtext_check.check_batch(req, compile_plan, correction=-20 * MIB, attempts=2)
    first, second = res.iterations
    assert first.budget_bytes == BUDGET + 20 * MIB and not first.xla_fits
    assert first.predicted_peak_bytes == solved[0].predicted.peak_device_bytes - 20 * MIB
    miss = BUDGET + 2 * MIB - solved[0].predicted.peak_device_bytes
    assert second.workspace_correction_bytes == miss and second.budget_bytes == BUDGET - miss
    assert second.xla_fits and res.fitted is solved[1] and res.fitted_iteration == 2
    err = (solved[1].predicted.peak_device_bytes + miss) / (BUDGET - 1 * MIB) - 1
    assert res.converged == (abs(err) <= 0.05)
    assert res.budget_bytes == BUDGET
