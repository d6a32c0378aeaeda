"""XLA:TPU's scheduler limit on copy overlap: the constants against their records, and the model's
rule at the limit (loads hidden below it, every load exposed above it) on the v5e chip check's
dense shape."""

import dataclasses
import json
import pathlib
import sys

import pytest

from tierax import costmodel as cm
from tierax.costmodel import rates as rates_lib
from tierax.models import apply_overrides, get_config
from tierax.plan.types import Plan
from tierax.tracing.inventory import model_inventory
from tierax.tracing.model_program import for_inventory

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
RESULTS = BENCH / "results"
sys.path[:0] = [str(BENCH), str(BENCH / "investigations")]
import tpu_copy_schedule  # noqa: E402 — the investigation's model and plan

DENSE, MLPWI_1_OFFLOAD = tpu_copy_schedule.DENSE, tpu_copy_schedule.KEEP_MLP


def test_peak_margin_is_the_chip_checks_measured_fit_margin():
    record = json.loads((RESULTS / "tpu_check.json").read_text())
    assert rates_lib.PEAK_UNDERPREDICTION_TPU == pytest.approx(
        record["fit_margin"]["margin"], abs=5e-5
    )


def test_v5e_scheduler_limit_is_95_percent_of_xlas_limit_less_the_margin():
    r = cm.target_rates("v5e", "bfloat16", calibration={})
    assert r.scheduler_limit_bytes == int(
        0.95 * r.device_limit_bytes / (1 + rates_lib.PEAK_UNDERPREDICTION_TPU)
    )
    assert "95 %" in r.sources["copy_overlap_limit"]
    assert cm.target_rates("h200", "bfloat16", calibration={}).scheduler_limit_bytes == 0


def test_deviceless_compiles_serialize_loads_only_near_the_limit():
    """The record the rule is read from: XLA:TPU put nothing between a backward load's start and
    done only where the compiled peak was within 5 % of the limit."""
    record = json.loads((RESULTS / "tpu_copy_schedule.json").read_text())
    cases = record["cases"]
    assert any(c["loads_serialized"] for c in cases) and not all(
        c["loads_serialized"] for c in cases
    )
    for c in cases:
        near = c["device_peak_bytes"] > 0.94 * c["device_limit_bytes"]
        assert c["loads_serialized"] == near, c


@pytest.mark.parametrize("microbatch, serialized", [(4, False), (8, True)])
def test_simulate_exposes_every_load_above_the_limit(microbatch, serialized):
    cfg = apply_overrides(get_config("tiny-llama"), DENSE)
    prog = for_inventory(cfg, model_inventory(cfg, microbatch, 2048))
    rates = cm.target_rates("v5e", "bfloat16", calibration={})
    plan = Plan.from_dict(
        {"plan": "p", "groups": {"decoder": {"default": "remat", **MLPWI_1_OFFLOAD}}}
    )
    p = cm.simulate(plan, prog, rates, "lhs")
    b = p.breakdown
    assert b.copies_serialized is serialized
    assert (p.peak_device_bytes > rates.scheduler_limit_bytes) is serialized
    # the loads' seconds by hand: the offloaded bytes (L − 1 layers on the host: the last stays on
    # device) plus nothing spare (stored a layer later), over the link
    loads_s = p.host_bytes * 8 / 7 / rates.h2d_bytes_per_s
    if serialized:
        assert b.exposed_h2d_s == pytest.approx(loads_s, rel=1e-9)
    else:
        assert b.exposed_h2d_s == 0.0


@pytest.mark.parametrize("microbatch, above", [(4, False), (8, True)])
def test_simulate_says_its_step_is_a_lower_bound_above_the_limit(microbatch, above):
    """A plan that fits but peaks above XLA:TPU's scheduler limit gets a row saying the step time
    leaves out XLA:TPU's own rematerialisation; below the limit, or on a GPU target, no such row."""
    from rich.console import Console

    from tierax.report.tables import prediction_table

    cfg = apply_overrides(get_config("tiny-llama"), DENSE)
    prog = for_inventory(cfg, model_inventory(cfg, microbatch, 2048))
    plan = Plan.from_dict(
        {"plan": "p", "groups": {"decoder": {"default": "remat", **MLPWI_1_OFFLOAD}}}
    )

    def text(target):
        p = cm.simulate(plan, prog, cm.target_rates(target, "bfloat16", calibration={}), "lhs")
        console = Console(width=400, record=True)
        console.print(prediction_table(p, "t"))
        return p, console.export_text()

    p, shown = text("v5e")
    limit = rates_lib.SCHEDULER_MEMORY_FRACTION * p.breakdown.fit_limit_bytes
    assert p.fits and p.breakdown.scheduler_limit_bytes == int(
        limit / (1 + rates_lib.PEAK_UNDERPREDICTION_TPU)
    )
    assert ("step time a lower bound" in shown) is above
    assert (p.peak_device_bytes > p.breakdown.scheduler_limit_bytes) is above
    g, shown = text("h100")
    assert g.breakdown.scheduler_limit_bytes == 0 and "lower bound" not in shown


def test_the_chips_boundary_is_the_models_and_its_last_fit_is_shown_uncertain():
    """The chip ran remat-full at the microbatch below its boundary and refused it at the boundary
    (bench/results/chip/tpu_check_lse.json, the boundary probed after the splash kernel's
    log-sum-exp buffer was priced; before it the model said the refused microbatch fits,
    tpu_check_boundary.json): the model gives the same verdicts, and marks the last fit uncertain
    (its peak within the model's largest under-prediction of the limit); well inside the limit, and
    on a GPU target, it does not."""
    from rich.console import Console

    from tierax import plan as plan_lib
    from tierax.report.tables import prediction_table

    record = json.loads((RESULTS / "chip" / "tpu_check_lse.json").read_text())
    refused = record["boundary"]["on_chip"]["refused_at"]
    assert record["boundary"]["on_chip"]["microbatch"] == refused - 1  # the chip ran this one
    cfg = apply_overrides(get_config("tiny-llama"), DENSE)
    plan = plan_lib.preset("remat-full", cfg)

    v5e = cm.target_rates("v5e", "bfloat16", calibration={})

    def shown(mb, rates=v5e):
        prog = for_inventory(cfg, model_inventory(cfg, mb, 2048))
        p = cm.simulate(plan, prog, rates, "lhs")
        console = Console(width=400, record=True)
        console.print(prediction_table(p, "t"))
        return p.fits, "fit uncertain" in console.export_text()

    assert shown(refused)[0] is False
    assert shown(refused - 1) == (True, True)
    assert shown(16) == (True, False)
    # a target without XLA:TPU's scheduler (not a TPU): the chip's peak error is not its own
    assert shown(refused - 1, dataclasses.replace(v5e, scheduler_limit_bytes=0)) == (True, False)
