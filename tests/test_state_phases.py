"""Offloaded training state in the predicted peak and step (issue 60, items 6 and 7): the streamed
update's copies run both directions at once (the host link is full duplex), and every phase's byte
figure, label and "not in the peak" line counts the state as the peak does.

Hand counts for Llama 3 8B (d 4096, 32 layers, 32/8 heads of 128, MLP 14336, vocab 128256, untied
head, float32 parameters): a decoder layer holds 2·4096² + 2·4096·1024 + 3·4096·14336 + 2·4096 =
218,112,000 parameters, the stack 6,979,584,000; with the embedding and head (2 · 128256 · 4096)
and the final norm the model has 8,030,261,248.
"""

from __future__ import annotations

import json

import pytest

DECODER_PARAMS = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
ALL_PARAMS = DECODER_PARAMS + 2 * 128256 * 4096 + 4096
H200_HBM = 4.8e12  # bytes/s, the H200's datasheet HBM rate

REMAT = "plan: r\ngroups:\n  decoder:\n    default: remat\n"


def _sim(cli, tmp_path, state: str, *extra) -> dict:
    plan = tmp_path / "p.yaml"
    plan.write_text(REMAT + (f"state:\n  decoder: {{{state}}}\n" if state else ""))
    r = cli("simulate", "--model", "llama3-8b", "--target", "h200", "--microbatch", "1",
            "--seq", "4096", "--plan", plan, "--json", *extra)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_streamed_moments_expose_the_slower_direction_only(cli, tmp_path):
    # h2d 50 GB/s, d2h 25 GB/s: both directions move the moments (8 bytes a parameter) at once;
    # only the slower one's excess over the update (7 · 4 bytes a parameter at HBM rate) shows.
    d = _sim(cli, tmp_path, "moments: offload", "--rate", "h2d=50", "--rate", "d2h=25")
    b = d["breakdown"]
    moved = 8 * DECODER_PARAMS
    assert b["state_h2d_bytes"] == b["state_d2h_bytes"] == moved
    update = 7 * 4 * DECODER_PARAMS / H200_HBM
    assert b["state_update_device_s"] == pytest.approx(update, rel=1e-9)
    want = moved / 25e9 - update  # not (moved/50e9 − update) + (moved/25e9 − update)
    assert b["state_exposed_s"] == pytest.approx(want, rel=1e-9)
    # and the step carries it once: the same step with the state on device differs by it
    base = _sim(cli, tmp_path, "", "--rate", "h2d=50", "--rate", "d2h=25")
    assert d["step_time_s"] - base["step_time_s"] == pytest.approx(want, rel=1e-6)


def test_phase_bytes_free_the_offloaded_state(cli, tmp_path):
    on = _sim(cli, tmp_path, "")["breakdown"]
    off = _sim(cli, tmp_path, "moments: offload")["breakdown"]
    freed = 8 * DECODER_PARAMS
    assert on["layer_phase_bytes"] - off["layer_phase_bytes"] == freed
    assert on["loss_phase_bytes"] - off["loss_phase_bytes"] == freed


def test_phase_bytes_hold_the_accumulator(cli, tmp_path):
    one = _sim(cli, tmp_path, "")["breakdown"]
    two = _sim(cli, tmp_path, "", "--grad-accum", "2")["breakdown"]
    acc = 4 * ALL_PARAMS  # the float32 accumulator of every parameter
    assert two["layer_phase_bytes"] - one["layer_phase_bytes"] == acc
    assert two["loss_phase_bytes"] - one["loss_phase_bytes"] == acc
    # offloading the decoder's accumulator takes its share back out of the microbatches' phases
    off = _sim(cli, tmp_path, "grad_accum: offload", "--grad-accum", "2")["breakdown"]
    assert two["layer_phase_bytes"] - off["layer_phase_bytes"] == 4 * DECODER_PARAMS


def test_update_peak_is_named_and_the_other_phases_are_below_it(cli, tmp_path):
    # 1 × 4096 with the moments on the host: the streamed update holds the most
    d = _sim(cli, tmp_path, "moments: offload")
    b, peak = d["breakdown"], d["peak_device_bytes"]
    assert b["peak_phase"] == "update"
    assert b["update_phase_bytes"] == peak
    assert b["layer_phase_bytes"] < peak and b["loss_phase_bytes"] < peak
    plan = tmp_path / "p.yaml"
    table = cli("simulate", "--model", "llama3-8b", "--target", "h200", "--microbatch", "1",
                "--seq", "4096", "--plan", plan).stdout  # fmt: skip
    assert "peak device (in the streamed optimizer update)" in table
    assert "in a layer backward" not in table


def test_accumulation_peak_is_named(cli, tmp_path):
    # every decoder part offloaded at 1 × 512: the accumulation (the state and the embedding's
    # accumulator left on device, the accumulator's slices) or the update holds the most
    plan = tmp_path / "p.yaml"
    d = _sim(cli, tmp_path, "moments: offload, master_weights: offload, grad_accum: offload",
             "--grad-accum", "2", "--seq", "512")  # fmt: skip
    b = d["breakdown"]
    phases = {
        "layer backward": b["layer_phase_bytes"],
        "loss": b["loss_phase_bytes"],
        "update": b["update_phase_bytes"],
        "accumulation": b["accumulation_phase_bytes"],
    }
    assert d["peak_device_bytes"] == max(phases.values())
    assert b["peak_phase"] == max(phases, key=phases.get)
    table = cli("simulate", "--model", "llama3-8b", "--target", "h200", "--microbatch", "1",
                "--seq", "512", "--grad-accum", "2", "--plan", plan).stdout  # fmt: skip
    label = {
        "update": "in the streamed optimizer update",
        "accumulation": "in a gradient accumulation",
        "loss": "at the loss",
        "layer backward": "in a layer backward",
    }[b["peak_phase"]]
    assert f"peak device ({label})" in table
