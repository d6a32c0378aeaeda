"""``tierax calibrate``'s mapping of measurements to the rates the cost model reads
(tierax.measure.calibrate.measure), with every microbenchmark replaced by a stand-in that returns
distinct, hand-chosen figures for what it was asked: each rate must come from the measurement that
measures it (the audit's survivor: a measurement stored under another rate's key went unnoticed)."""

from __future__ import annotations

import pytest

from tierax.measure import calibrate, harness

TOUCH = 3.0e9  # the first-touch rate the memory stand-in reports
STREAM = 11.0e9
NONMATMUL = 7.0e9
SPREAD, ALIASED = 2.0e8, 5.0e7
MIX = {"float32": 130.0e9, "bfloat16": 90.0e9}
HEAD = {"bfloat16": 210.0e9}


def _size_rate(dtype: str, dim: int) -> float:
    return MIX[dtype] * dim / 1000  # a different figure for every (dtype, dimension)


@pytest.fixture
def stand_ins(monkeypatch):
    calls = []

    def stream_and_first_touch(nbytes, repeats):
        calls.append(("memory", nbytes))
        return {"memory_bytes_per_s": STREAM, "first_touch_bytes_per_s": TOUCH}

    def nonmatmul_rate(shape, repeats, first_touch_bytes_per_s):
        calls.append(("nonmatmul", first_touch_bytes_per_s))
        return {"bytes_per_s": NONMATMUL}

    def transposed_fusion_rate(repeats, first_touch_bytes_per_s):
        calls.append(("transposed", first_touch_bytes_per_s))
        return {"spread": {"elems_per_s": SPREAD}, "aliased": {"elems_per_s": ALIASED}}

    def matmul_mix_rate(dtype, shapes=None, repeats=5, first_touch_bytes_per_s=None, roles=None):
        head = roles is harness.HEAD_MATMUL_ROLES
        calls.append(("mix", dtype, shapes, head, first_touch_bytes_per_s))
        if roles is harness.HEAD_MATMUL_ROLES:
            assert shapes == harness.CPU_HEAD_MATMUL_SHAPES
            return {"flops_per_s": HEAD[dtype]}
        if shapes is None:
            return {"flops_per_s": MIX[dtype]}
        (dim,) = {min(s) for s in shapes}
        assert shapes == harness.cpu_matmul_size_shapes(dim)
        return {"flops_per_s": _size_rate(dtype, dim)}

    for name, fn in {
        "stream_and_first_touch": stream_and_first_touch,
        "nonmatmul_rate": nonmatmul_rate,
        "transposed_fusion_rate": transposed_fusion_rate,
        "matmul_mix_rate": matmul_mix_rate,
    }.items():
        monkeypatch.setattr(harness, name, fn)
    return calls


def test_every_cpu_rate_comes_from_the_measurement_of_it(stand_ins):
    stages = []
    entry = calibrate.measure(stages.append, repeats=1)
    assert stages == calibrate.stages(gpu=False)
    # memory: the stream rate as such, the cost model's memory rate from the non-matmul work
    assert entry["stream_bytes_per_s"] == STREAM
    assert entry["memory_bytes_per_s"] == NONMATMUL
    assert entry["first_touch_bytes_per_s"] == TOUCH
    assert entry["transpose_read_elems_per_s"] == SPREAD
    assert entry["transpose_aliased_read_elems_per_s"] == ALIASED
    for dtype in calibrate.DTYPES:
        assert entry[f"matmul_flops_per_s_{dtype}"] == MIX[dtype]
        mix_dim = min(min(s) for s in harness.CPU_MATMUL_SHAPES)  # 640, by hand: the mix's K
        assert mix_dim == 640
        assert entry[f"matmul_size_rates_{dtype}"] == [
            *([d, _size_rate(dtype, d)] for d in harness.CPU_MATMUL_SIZE_DIMS),
            [640, MIX[dtype]],
        ]
    assert entry["head_matmul_flops_per_s_bfloat16"] == HEAD["bfloat16"]
    assert entry["matmul_flops_per_s"] == MIX["float32"]  # the key older versions read
    # every GEMM and fusion measurement had its page faults taken off at the measured rate
    assert all(c[-1] == TOUCH for c in stand_ins if c[0] != "memory")
    assert "d2h_bytes_per_s" not in entry  # no host link on a CPU


def test_the_rates_the_cost_model_reads_are_the_entrys(stand_ins, tmp_path, monkeypatch):
    """The saved entry, read back as the CPU target's rates: each figure where the model reads
    it."""
    from tierax import costmodel

    monkeypatch.setenv("TIERAX_CALIBRATION", str(tmp_path / "calibration.json"))
    calibrate.save(calibrate.measure(repeats=1), key="cpu")
    for dtype in calibrate.DTYPES:
        r = costmodel.target_rates("cpu", dtype)
        assert r.matmul_flops_per_s == MIX[dtype]
        assert r.hbm_bytes_per_s == NONMATMUL  # the non-matmul work's rate, not the stream's
        assert r.first_touch_bytes_per_s == TOUCH
        assert (r.transpose_read_elems_per_s, r.transpose_aliased_read_elems_per_s) == (
            SPREAD,
            ALIASED,
        )
        assert r.matmul_size_rates == (
            *((d, _size_rate(dtype, d)) for d in harness.CPU_MATMUL_SIZE_DIMS),
            (640, MIX[dtype]),
        )
    assert costmodel.target_rates("cpu", "bfloat16").head_matmul_flops_per_s == HEAD["bfloat16"]
