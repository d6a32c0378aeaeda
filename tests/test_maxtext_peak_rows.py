"""The rows of a predicted peak add up to it (``simulate``'s "peak device, made of" rows;
:func:`tierax.costmodel.prediction.peak_rows`): issue 69 found MaxText programs whose rows added to
more than the stated peak, the gradients a TPU writes after the layers' backward left out of the
layer phase's state row (olmo3: 8.7 rows for a 7.9 GiB peak; llama4 37.8 for 33.1).

Checked on MaxText's own program (traced in this process) on a TPU target, where the layer phase
leaves those gradients out, under MaxText's policies that peak in each phase, and on breakdowns
whose phase is after the layers' backward or a group's own layer phase (the fields set here).
"""

from __future__ import annotations

import dataclasses

import maxtext_cli as M
import pytest

pytestmark = [M.requires_maxtext, M.programs_once]

TINY = [*M.TINY, "per_device_batch_size=2", "max_target_length=256"]


def _predict(*keys: str, target: str = "v5p"):
    from tierax import costmodel as cm
    from tierax.interop.maxtext_program import program

    given = {k.partition("=")[0] for k in keys}
    user = [k for k in TINY if k.partition("=")[0] not in given]
    run = program(M.base_yml(), [*user, *keys], target=target, devices=4)
    rates = cm.target_rates(target, run.program.dtype)
    return cm.simulate(run.plan, run.program, rates, "lhs", run.grad_accum)


def _total(b, rows) -> int:
    return sum(n for _, n in rows)


@pytest.mark.parametrize(
    "keys",
    [
        ["remat_policy=full"],
        ["remat_policy=minimal"],  # kept names read in place: a phase per group
        ["remat_policy=qkv_proj_offloaded"],
        ["remat_policy=full", "num_vocab_tiling=2"],
        ["remat_policy=full", "vocab_size=65536"],  # peaks at the loss
    ],
)
def test_the_rows_add_up_to_the_peak(keys):
    from tierax.costmodel.prediction import peak_rows

    pred = _predict(*keys)
    b = pred.breakdown
    rows = peak_rows(b)
    assert _total(b, rows) == pred.peak_device_bytes, rows
    if b.peak_phase == "layer backward" and b.late_grad_bytes > 0:
        assert "written after the layers" in rows[0][0]
    if b.peak_phase == "layer backward" and b.late_grad_bytes < 0:
        # the loss's buffer held through the layers' backward larger than the late gradients (the
        # q/k/v offload: the logits' gradient, tpu_terms' reading of an offloading step)
        assert "held through the layers" in rows[0][0]


def test_the_rows_of_each_phase_add_up_to_it():
    """Each phase's rows (the peak's phase set to it) add up to the phase's bytes: the loss, the
    layer phase, and the layer phase after the layers' backward where that is the larger."""
    from tierax.costmodel.prediction import after_backward_peaks, peak_rows, phase_text

    b = _predict("remat_policy=full").breakdown
    loss = dataclasses.replace(b, peak_phase="loss")
    assert _total(loss, peak_rows(loss)) == b.loss_phase_bytes
    layer = dataclasses.replace(b, peak_phase="layer backward")
    assert _total(layer, peak_rows(layer)) == b.layer_phase_bytes
    # after the layers' backward, larger than a layer's backward by 1 GiB
    extra = b.activation_bytes + b.staging_bytes + b.accumulator_device_bytes
    freed = b.state_bytes - b.state_device_bytes
    after_bytes = b.layer_phase_bytes + 2**30 - extra - b.fixed_device_bytes + freed
    after = dataclasses.replace(
        layer, after_backward_bytes=after_bytes, layer_phase_bytes=b.layer_phase_bytes + 2**30
    )
    assert after_backward_peaks(after) and phase_text(after) == "after the layers' backward"
    rows = peak_rows(after)
    assert rows[0][0].startswith("after the layers' backward")
    assert _total(after, rows) == after.layer_phase_bytes
    # a group's own layer phase below the largest workspace's (its kept names read in place)
    group = dataclasses.replace(layer, layer_phase_bytes=b.layer_phase_bytes - 2**20)
    rows = peak_rows(group)
    assert rows[-1] == (rows[-1][0], -(2**20)) and "kept names" in rows[-1][0]
    assert _total(group, rows) == group.layer_phase_bytes
