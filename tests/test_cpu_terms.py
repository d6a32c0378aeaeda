"""XLA:CPU's two extra time terms against hand computation: first touch (fresh temporary pages
faulted in per step, above malloc's mmap threshold) and the transposing fusions (slow reads, by
row-stride class, depending on what each plan keeps in the scan's stacks)."""

from __future__ import annotations

import dataclasses

import pytest

from tierax import costmodel as cm
from tierax import names as N
from tierax import plan as plan_lib
from tierax.costmodel.first_touch import MMAP_THRESHOLD_MAX_BYTES, first_touch_s
from tierax.costmodel.transposes import transpose_s
from tierax.plan import Placement
from tierax.tracing.inventory import Activation, GroupInventory, Inventory

MiB = 2**20
RATES = cm.Rates(
    "hand",
    matmul_flops_per_s=1e12,
    hbm_bytes_per_s=1e10,
    d2h_bytes_per_s=1.0,
    h2d_bytes_per_s=1.0,
    interconnect_bytes_per_s=1.0,
    device_memory_bytes=10**12,
    host_memory_bytes=10**12,
    offload_is_real=False,
    first_touch_bytes_per_s=1e9,
    transpose_read_elems_per_s=1e9,  # spread rows
    transpose_aliased_read_elems_per_s=1e8,  # rows a multiple of 4 KiB apart: 10× slower
)
A, B = N.MLPWI_0, N.MLPWO


def _group(layers=4) -> GroupInventory:
    return GroupInventory(
        "decoder",
        layers,
        (
            Activation("decoder", N.DECODER_LAYER_INPUT, 1000, layers),
            Activation("decoder", A, 1000, layers, transposed_elems_per_layer=4e6),
            Activation("decoder", B, 1000, layers, transposed_aliased_elems_per_layer=2e5),
        ),
        carry_bytes_per_layer=1000,
        save_all_bytes_per_layer=3000,
        base_recompute_flops_per_layer=0.0,
        forward_flops_per_layer=0.0,
        layer_param_count=0,
        transposed_always_elems_per_layer=1e6,
        transposed_always_aliased_elems_per_layer=1e5,
        transposed_carry_elems_per_layer=2e6,
        transposed_residual_elems_per_layer=3e6,
    )


def _inv(groups, param_bytes=100 * MiB, optimizer_bytes=200 * MiB) -> Inventory:
    return Inventory(
        "hand",
        1,
        8,
        {"data": 1, "fsdp": 1},
        tuple(groups),
        param_bytes,
        param_bytes,
        optimizer_bytes,
        0,
        0,
    )


# Where a plan places a group's unnamed intermediates too (main's ``plan.UNNAMED``), "no remat"
# means those kept as well; without that key, every name off REMAT is no remat.
UNNAMED = getattr(plan_lib, "UNNAMED", None)


def _placements(a, b):
    out = {("decoder", A): a, ("decoder", B): b}
    if UNNAMED is not None:
        no_remat = Placement.REMAT not in (a, b)
        out[("decoder", UNNAMED)] = Placement.DEVICE if no_remat else Placement.REMAT
    return out


# Per layer, by hand (spread at 1e9/s, aliased at 1e8/s): always 1e6/1e9 + 1e5/1e8 = 2 ms; carry
# 2 ms; the unnamed residuals 3 ms; A 4 ms; B 2e5/1e8 = 2 ms.  Four layers.
@pytest.mark.parametrize(
    "a, b, ms",
    [
        (Placement.DEVICE, Placement.DEVICE, 4 * (2 + 2 + 3 + 4 + 2)),  # no remat: every stack
        (Placement.OFFLOAD, Placement.DEVICE, 4 * (2 + 2 + 3 + 4 + 2)),  # offload: still kept
        (Placement.DEVICE, Placement.REMAT, 4 * (2 + 2 + 4)),  # remat policy: kept names only
        (Placement.OFFLOAD, Placement.REMAT, 4 * (2 + 2 + 4)),
        (Placement.REMAT, Placement.DEVICE, 4 * (2 + 2 + 2)),
        (Placement.REMAT, Placement.REMAT, 4 * (2 + 2)),  # the broadcasts and the carry remain
    ],
)
def test_transposing_reads_follow_what_the_plan_keeps(a, b, ms):
    assert transpose_s(_placements(a, b), _inv([_group()]), RATES) == pytest.approx(ms * 1e-3)


def test_a_one_layer_group_has_no_stacks_and_no_rate_no_term():
    one = _inv([_group(layers=1)])
    for a, b in ((Placement.DEVICE, Placement.DEVICE), (Placement.REMAT, Placement.REMAT)):
        assert transpose_s(_placements(a, b), one, RATES) == pytest.approx(2e-3)  # always only
    gpu = dataclasses.replace(RATES, transpose_read_elems_per_s=0.0)
    assert transpose_s(_placements(Placement.DEVICE, Placement.DEVICE), _inv([_group()]), gpu) == 0
    # No aliased rate (an older calibration): aliased rows at the spread rate.
    old = dataclasses.replace(RATES, transpose_aliased_read_elems_per_s=0.0)
    ms = 4 * (1 + 0.1 + 2 + 3 + 4 + 0.2)  # always 1e6/1e9 + 1e5/1e9; B 2e5/1e9
    got = transpose_s(_placements(Placement.DEVICE, Placement.DEVICE), _inv([_group()]), old)
    assert got == pytest.approx(ms * 1e-3)


@pytest.mark.parametrize(
    "fresh, seconds",
    [
        (MMAP_THRESHOLD_MAX_BYTES, 0.0),  # at malloc's threshold: may be recycled, not counted
        (MMAP_THRESHOLD_MAX_BYTES + 1, (32 * MiB + 1) / 1e9),
        (500 * MiB, 500 * MiB / 1e9),
        (-50 * MiB, 0.0),  # a peak below the donated state
    ],
)
def test_first_touch_is_the_peak_less_the_donated_state_above_the_mmap_threshold(fresh, seconds):
    inv = _inv([_group()])  # 100 MiB parameters, 200 MiB optimizer state (donated, reused)
    peak = 300 * MiB + fresh
    assert first_touch_s(peak, inv, RATES) == pytest.approx(seconds, abs=0.0)
    assert first_touch_s(peak, inv, dataclasses.replace(RATES, first_touch_bytes_per_s=0)) == 0
