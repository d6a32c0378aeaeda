"""`tierax profile` on a TPU trace: XLA:TPU's trace shows a host copy only as the wait in its
``*-done`` op, so those waits are the step's exposed transfers (the store's wait below is the
v5e chip's own op as bench/results/chip/profiles/dense_planned_ops.json recorded it; the load's
follows the same ``async-done`` form), container ops count as neither compute nor transfer, and no
bandwidth is claimed."""

from __future__ import annotations

import json
import pathlib

import pytest

from tierax.measure import trace

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEV = "/device:TPU:0"


def _recorded_store_name() -> str:
    doc = json.loads((ROOT / "bench/results/chip/profiles/dense_planned_ops.json").read_text())
    ops = next(ln for ln in doc["lines"] if ln["thread"] == "XLA Ops")["ops"]
    return next(o for o in ops if o["name"] == "dynamic-update-slice-done")["args"]["long_name"]


LOAD = (
    "%dynamic-slice-done = bf16[1,8,2048,8192]{3,2,1,0:T(8,128)(2,1)} async-done(((bf16[7,8,2048,"
    "8192]{3,2,1,0:T(8,128)(2,1)S(5)}, s32[]{:T(128)}, s32[]{:T(128)}), bf16[1,8,2048,8192]{3,2,1,"
    "0:T(8,128)(2,1)}, u32[]{:S(2)}) %dynamic-slice-start)"
)
DEVICE_COPY = "%copy-done.4 = bf16[8,2048,2048]{1,2,0:T(8,128)(2,1)} async-done((bf16[8,2048,2048])"
SLICE = 8 * 2048 * 8192 * 2  # one layer's mlpwi_1, bf16


def _op(name, start, dur, long_name=""):
    args = {"long_name": long_name} if long_name else {}
    return trace.Event(DEV, "XLA Ops", name, start, dur, args)


def _events():
    return [
        trace.Event("/host:CPU", "python", trace.STEP_ANNOTATION, 0, 1000, {"step_num": 0}),
        _op("while.3", 0, 900),  # holds the ops below: neither compute nor a copy
        _op("fusion.358", 0, 300),
        _op("dynamic-update-slice-done", 300, 80, _recorded_store_name()),
        _op("fusion.363", 380, 200),
        _op("dynamic-slice-done", 580, 20, LOAD),
        _op("copy-done.4", 600, 10, DEVICE_COPY),  # device to device: compute
        _op("fusion.364", 610, 290),
    ]


def test_a_tpu_host_copy_is_its_wait_with_the_slices_bytes():
    store, load = _events()[3], _events()[5]
    assert trace.tpu_host_copy(store) == ("d2h", SLICE)
    assert trace.tpu_host_copy(load) == ("h2d", SLICE)
    assert trace.tpu_host_copy(_events()[6]) is None
    on_host = LOAD.replace("bf16[1,8,2048,8192]{3,2,1,0:T(8,128)(2,1)}", "bf16[1]{0:S(5)}", 1)
    assert trace.tpu_host_copy(_op("dynamic-slice-done", 0, 1, on_host)) is None  # host to host
    gpu = trace.Event("/device:GPU:0", "Stream #1", "dynamic-update-slice-done", 0, 1, store.args)
    assert trace.tpu_host_copy(gpu) is None


def test_a_tpu_step_reports_the_waits_as_exposed_and_no_bandwidth():
    a = trace.analyze(_events())
    (s,) = a.steps
    assert a.backend == "tpu" and a.transfers_observed
    assert s.compute_s == pytest.approx((300 + 200 + 10 + 290) / 1e6)  # no while, no waits
    assert (s.d2h.busy_s, s.d2h.exposed_s, s.d2h.overlap_s) == (80 / 1e6, 80 / 1e6, 0.0)
    assert (s.h2d.exposed_s, s.h2d.bytes, s.d2h.bytes) == (20 / 1e6, SLICE, SLICE)
    assert s.exposed_s == pytest.approx(100 / 1e6) and s.overlap_s == 0
    assert s.d2h.bandwidth_bytes_per_s is None and a.summary()["d2h_bandwidth_bytes_per_s"] is None
    assert trace.TPU_NOTE in a.notes


def test_a_tpu_trace_without_host_copies_says_so():
    evs = [e for e in _events() if "slice-done" not in e.name]
    a = trace.analyze(evs)
    assert a.backend == "tpu" and not a.transfers_observed
    assert "no host↔device copies in the analysed steps" in a.notes
