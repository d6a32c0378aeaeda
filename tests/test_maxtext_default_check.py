"""No plan MaxText refuses, by default: ``plan --maxtext`` on a TPU target confirms its plan with
MaxText's own compile (``--check``'s loop) unless ``--no-check``; a plan not confirmed says
"predicted, not compiled" and is planned within the budget less the fidelity record's worst
held-out under-prediction.

The confirming compile is MaxText's own step (tests/test_maxtext_plan_check.py checks that loop's
file against a separate compile); here what runs by default and what the output says, on a tiny
2-layer config whose compile takes seconds, and the margin against the record it is taken from.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import maxtext_cli as M
import pytest

pytestmark = [M.requires_maxtext, M.programs_once]

TINY = [*M.TINY, "per_device_batch_size=2", "max_target_length=256"]
RECORD = pathlib.Path(__file__).parents[1] / "bench" / "results" / "maxtext_fidelity.json"


def _args(**kw) -> argparse.Namespace:
    base = dict(target="v5p", devices=4, mesh=None, check=False, no_check=False)
    return argparse.Namespace(**(base | kw))


@pytest.mark.parametrize(
    "given, check, why",
    [
        ({}, True, None),
        ({"devices": None, "mesh": "fsdp=4"}, True, None),
        ({"check": True}, True, None),
        ({"no_check": True}, False, "--no-check"),
        ({"target": "h200"}, False, "GPU compile is not run by default"),
        ({"devices": None}, False, "no --devices N"),
        ({"target": "vr200"}, False, "projection"),
    ],
)
def test_which_plans_are_checked_by_default(given, check, why):
    from tierax.cli.maxtext_simulate import default_check

    args = _args(**given)
    default_check(args)
    assert args.check is check
    assert (args.unconfirmed is None) if why is None else (why in args.unconfirmed)


def test_check_and_no_check_together_are_refused():
    from tierax.cli.maxtext_simulate import default_check
    from tierax.errors import TieraxError

    with pytest.raises(TieraxError, match="give one"):
        default_check(_args(check=True, no_check=True))


def test_no_check_without_maxtext_is_refused():
    r = M.tierax("plan", "--model", "tiny-llama", "--no-check", "--target", "v5p")
    assert r.returncode == 2 and "goes with --maxtext" in r.stderr, r.stderr[-2000:]


def _plan(*extra, run=M.tierax):
    """``plan --maxtext`` of the tiny config; ``run``: in a child process (default: the compile
    --check runs starts JAX for a TPU), or ``cli`` (this process) for a plan that compiles
    nothing."""
    argv = ["plan", "--maxtext", M.base_yml(), *TINY, "--target", "v5p", "--devices", "4"]
    r = run(*argv, *extra, "--json")
    return r, json.loads(r.stdout[r.stdout.index("{") :]) if "{" in r.stdout else None


def test_a_tpu_plan_is_compiled_by_default():
    """No --check given: MaxText's compile ran, the plan reported is one whose compile fitted, and
    the output says how many compiles it took (exit 0 converged, 1 fitted but not within 5 %)."""
    r, doc = _plan()
    assert r.returncode in (0, 1), r.stderr[-3000:]
    assert doc["confirmed"] is True and doc["compiles"] >= 1
    fitted = doc["iterations"][doc["fitted_iteration"] - 1]
    assert fitted["xla_fits"] and fitted["xla_peak_bytes"] <= doc["budget_bytes"]
    assert any(f"plan --check: {doc['compiles']} MaxText compile(s)" in n for n in doc["notes"])
    assert f"after {doc['compiles']} compile(s)" in r.stderr


def test_no_check_says_predicted_not_compiled_and_keeps_the_margin(cli):
    from tierax.cli.maxtext_simulate import UNCONFIRMED_MARGIN

    r, doc = _plan("--no-check", run=cli)
    assert r.returncode == 0, r.stderr[-3000:]
    assert doc["confirmed"] is False and doc["compiles"] == 0
    assert doc["unconfirmed_margin"] == UNCONFIRMED_MARGIN
    note = next(n for n in doc["notes"] if n.startswith("predicted, not compiled (--no-check)"))
    assert f"{UNCONFIRMED_MARGIN:.1%} margin" in note
    # planned within the budget less the margin (v5p's usable HBM divided by 1 + margin)
    full = float(note.split("the device budget ")[1].split(" GiB")[0]) * 2**30
    assert doc["budget_bytes"] == pytest.approx(full / (1 + UNCONFIRMED_MARGIN), rel=1e-3)
    assert doc["predicted"]["peak_device_bytes"] <= doc["budget_bytes"]


def test_the_margin_is_the_records_worst_held_out_under_prediction():
    """UNCONFIRMED_MARGIN is read from bench/results/maxtext_fidelity.json: the most MaxText's
    compiled peak exceeded the prediction (compiled ÷ predicted − 1) among the held-out cases."""
    from tierax.cli.maxtext_simulate import UNCONFIRMED_MARGIN

    cases = json.loads(RECORD.read_text())["cases"]
    held = [c for c in cases if c.get("held_out") and "peak_error" in c]
    assert held, "the record has held-out cases"
    worst = max(0.0, *(1 / (1 + c["peak_error"]) - 1 for c in held))
    assert UNCONFIRMED_MARGIN == pytest.approx(worst, abs=5e-4)
