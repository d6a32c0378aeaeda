"""The cost model's libtpu-keyed TPU term: what libtpu 0.0.42.1 (jax 0.10.2's, the one ``make venv``
installs) reports beyond its own buffer assignment at an untiled loss, by hand for a tiny config,
and against the deviceless compiles of bench/results/tpu_default_env.json (Llama 3 8B, 8 v5p,
the planner's plans), re-predicted here from the plans that record holds.
"""

import dataclasses
import json
import pathlib

import pytest

from tierax import costmodel as cm
from tierax import plan as plan_lib
from tierax.costmodel import fixed
from tierax.hardware import libtpu
from tierax.mesh import MeshShape
from tierax.models import get_config
from tierax.models.config import for_platform
from tierax.tracing import inventory as inv_lib
from tierax.tracing.model_program import for_inventory
from tierax.tracing.program import Head

RECORD = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results" / "tpu_default_env.json"


@pytest.mark.parametrize(
    "version, older",
    [
        ("0.0.42.1", True),
        ("0.0.50.1", True),
        ("0.0.51", True),
        ("0.0.52", False),
        ("0.0.53", False),
        ("0.1.0", False),
        ("", False),  # none installed: the traced terms
    ],
)
def test_versions_before_the_traced_libtpu_are_the_older(version, older):
    assert libtpu.older_than_traced(version) is older


def _terms(libtpu_version: str, *, mesh=None, **overrides):
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16", **overrides)
    inv = inv_lib.model_inventory(cfg, 2, 16, mesh or {"fsdp": 2})
    rates = dataclasses.replace(cm.target_rates("v5p", cfg.dtype), libtpu=libtpu_version)
    return fixed.fixed_terms(for_inventory(cfg, inv), rates, "lhs")


def test_older_libtpu_adds_one_logits_and_three_head_sized_buffers_at_the_loss():
    # By hand: tiny-llama (V 256, D 64) in bfloat16 (2 B), microbatch 2 × seq 16 = 32 tokens per
    # device, fsdp=2: a [32, 256] and three [256, 64] bf16 buffers = 2·256·(32 + 192) B.
    new, old = _terms("0.0.52"), _terms("0.0.42.1")
    assert old.logits_bytes - new.logits_bytes == 2 * 256 * (32 + 3 * 64) == 114_688
    assert libtpu_excess() == 114_688
    # only the loss phase: the layer loop's terms are libtpu's own either way
    assert (old.workspace_bytes, old.stack_copy_bytes, old.state_bytes) == (
        new.workspace_bytes,
        new.stack_copy_bytes,
        new.state_bytes,
    )


def libtpu_excess() -> int:
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16")
    return fixed.libtpu_temp_excess_bytes(Head(cfg.d_model, cfg.vocab_size), 2, 2, 32)


def test_older_libtpu_term_stops_above_the_measured_tokens():
    """At TR-1's 3 × 8192 tokens per device the formula would add 9.46e9 bytes where libtpu
    0.0.42.1's temp exceeds its HBM heap by 1.66e9 (bench/results/libtpu_colors_tr1.json): above
    the measured 8192 tokens the term adds nothing."""
    doc = json.loads((RECORD.parent / "libtpu_colors_tr1.json").read_text())
    cfg = get_config("llama3.1-8b")
    tokens = 3 * 8192
    assert doc["reading"]["libtpu_temp_excess_formula_bytes"] == 2 * 128256 * (tokens + 3 * 4096)
    assert doc["reading"]["temp_minus_color_0_bytes"] < 0.2 * 2 * 128256 * (tokens + 3 * 4096)
    head = Head(cfg.d_model, cfg.vocab_size)
    assert fixed.libtpu_temp_excess_bytes(head, 2, 8, tokens) == 0
    assert fixed.libtpu_temp_excess_bytes(head, 2, 8, 8192) == 2 * 128256 * (8192 + 3 * 4096)


def test_older_libtpu_term_is_only_where_it_was_measured():
    """Measured under FSDP with an untiled loss; one device, or a tiled loss, are not changed."""
    assert _terms("0.0.42.1", mesh={"fsdp": 1}) == _terms("0.0.52", mesh={"fsdp": 1})
    assert _terms("0.0.42.1", loss_tiles=2) == _terms("0.0.52", loss_tiles=2)
    assert _terms("", mesh={"fsdp": 2}) == _terms("0.0.52", mesh={"fsdp": 2})


def test_target_rates_follow_the_installed_libtpu(monkeypatch):
    monkeypatch.setattr(libtpu, "installed_version", lambda: "0.0.42.1")
    older = cm.target_rates("v5p", "bfloat16")
    assert older.libtpu == "0.0.42.1" and "0.0.42.1" in older.sources["libtpu"]
    assert cm.target_rates("h200", "bfloat16").libtpu == ""  # a GPU target: none
    monkeypatch.setattr(libtpu, "installed_version", lambda: "0.0.52")
    traced = cm.target_rates("v5p", "bfloat16")
    assert traced.libtpu == "0.0.52" and "libtpu" not in traced.sources


def _record_cases():
    doc = json.loads(RECORD.read_text())
    return [c for c in doc["cases"] if "compile" in c]


@pytest.mark.skipif(not RECORD.exists(), reason="bench/results/tpu_default_env.json not written")
def test_the_model_holds_5pct_of_libtpu_0_0_42_1s_compiles_in_the_record():
    """Each compiled case of the record: the model now, for the plan the record holds and the
    record's libtpu, within 5 % of XLA's peak there, and over 5 % off without the libtpu term
    (the record's cases are the ones that term was needed for)."""
    doc = json.loads(RECORD.read_text())
    assert doc["versions"]["libtpu"] == "0.0.42.1"
    cases = _record_cases()
    assert {(c["microbatch"], c["seq"]) for c in cases} >= {(1, 4096), (2, 4096), (1, 8192)}
    cfg = for_platform(get_config("llama3-8b"), "tpu")  # attention auto: splash, as compiled
    mesh = MeshShape(fsdp=8)
    for c in cases:
        plan = plan_lib.Plan.from_yaml(c["plan_yaml"])
        inv = inv_lib.model_inventory(cfg, c["microbatch"], c["seq"], mesh.to_dict())
        rates = cm.target_rates("v5p", cfg.dtype)
        xla = c["compile"]["device_peak_bytes"]
        got = {}
        for version in ("0.0.42.1", "0.0.52"):
            r = dataclasses.replace(rates, libtpu=version)
            got[version] = cm.simulate(plan, for_inventory(cfg, inv), r, "lhs").peak_device_bytes
        assert got["0.0.42.1"] == c["compile"]["predicted"]["peak_device_bytes"]  # as compiled
        assert abs(got["0.0.42.1"] / xla - 1) <= 0.05, (c["microbatch"], c["seq"], got, xla)
        assert got["0.0.52"] / xla - 1 < -0.05, (c["microbatch"], c["seq"], got, xla)


def test_fits_is_decided_by_what_xla_tpu_assigns_not_by_the_older_libtpus_report():
    """The peak follows what the installed libtpu's memory_analysis() reports (the older libtpu's
    excess included); `fits` compares what XLA:TPU assigns, the excess taken out (XLA:TPU compiles
    a program by its buffer assignment: tierax compile's fits, tests/test_tpu_kept_layout.py).
    With a limit between the two, the older libtpu's prediction fits; a limit below the assignment
    does not.  A 4096-token vocabulary makes the loss the peak phase."""
    cfg = dataclasses.replace(get_config("tiny-llama"), dtype="bfloat16", vocab_size=4096)
    inv = inv_lib.model_inventory(cfg, 2, 16, {"fsdp": 2})
    plan = plan_lib.preset("remat-full", cfg)
    excess = 2 * 4096 * (32 + 3 * 64)  # by hand, as above: [32, V] and three [V, 64] in bf16

    def predict(version, limit=0):
        rates = dataclasses.replace(
            cm.target_rates("v5p", cfg.dtype), libtpu=version, device_limit_bytes=limit
        )
        return cm.simulate(plan, for_inventory(cfg, inv), rates, "lhs")

    new, old = predict("0.0.52"), predict("0.0.42.1")
    assert old.breakdown.peak_phase == "loss"  # the fixture reaches the excess's phase
    assert old.breakdown.reported_excess_bytes == excess
    assert old.peak_device_bytes - new.peak_device_bytes == excess
    assert old.breakdown.assigned_peak_bytes == new.peak_device_bytes
    assert new.breakdown.assigned_peak_bytes == new.peak_device_bytes
    assert new.breakdown.reported_excess_bytes == 0
    between = new.peak_device_bytes + excess // 2
    assert predict("0.0.42.1", between).fits and predict("0.0.52", between).fits
    assert not predict("0.0.42.1", new.peak_device_bytes - 1).fits

    # simulate's table names the assigned peak and the excess wherever one is reported, so a
    # reported peak above the limit beside "fits: yes" reads as what it is
    from rich.console import Console

    from tierax.report.tables import fmt_bytes, prediction_table

    def rendered(pred):
        console = Console(width=400, record=True)
        console.print(prediction_table(pred, "predicted step"))
        return console.export_text()

    text = rendered(old)
    row = next(line for line in text.splitlines() if "assigned peak" in line)
    assert fmt_bytes(excess) in row and fmt_bytes(new.peak_device_bytes) in row
    assert "assigned peak" not in rendered(new)
