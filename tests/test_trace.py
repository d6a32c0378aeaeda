"""Trace parsing and the transfer/overlap arithmetic (tierax.measure.trace), and `tierax profile`.

Fixtures:
* ``fixtures/gpu_synthetic_trace.json`` — written by hand in Perfetto/Chrome JSON with
  GPU-like streams (kernels on one stream, MemcpyD2H/MemcpyH2D on copy streams), with
  overlaps chosen so every number below is known exactly;
* ``fixtures/cpu_trace/`` — a real 2-step XLA:CPU trace of tiny-llama
  (``fixtures/record_cpu_trace.py`` re-records it).
"""

import gzip
import json
import pathlib

import pytest

from tierax.errors import TieraxError
from tierax.measure import profile as profile_lib
from tierax.measure import trace as T
from tierax.records import PROFILE_SCHEMA

FIX = pathlib.Path(__file__).parent / "fixtures"
GPU = FIX / "gpu_synthetic_trace.json"
CPU = FIX / "cpu_trace"
US = 1e-6


# --- interval arithmetic -----------------------------------------------------------


def test_union_merges_overlapping_touching_and_nested_intervals():
    assert T.union([(5, 7), (0, 2), (1, 3), (3, 4), (6, 6.5), (9, 9)]) == [(0, 4), (5, 7)]
    assert T.length(T.union([(0, 10), (2, 3)])) == 10


def test_intersection_length():
    a = T.union([(0, 4), (6, 10)])
    b = T.union([(3, 7), (9, 12)])
    assert T.intersection_length(a, b) == 1 + 1 + 1
    assert T.intersection_length(a, []) == 0


# --- classification ----------------------------------------------------------------------


def _ev(name, **args):
    return T.Event("/device:GPU:0", "Stream #1", name, 0.0, 1.0, args)


@pytest.mark.parametrize(
    "event, expected",
    [
        (_ev("MemcpyH2D"), "h2d"),
        (_ev("MemcpyHtoD"), "h2d"),
        (_ev("MemcpyD2H"), "d2h"),
        (_ev("MemcpyDtoH"), "d2h"),
        (_ev("Memcpy", memcpy_details="kind_src:pinned kind_dst:device size:8"), "h2d"),
        (_ev("Memcpy", memcpy_details="kind_src:device kind_dst:pinned size:8"), "d2h"),
        (_ev("MemcpyD2D", memcpy_details="kind_src:device kind_dst:device size:8"), "other"),
        (_ev("Memset"), "other"),
        (_ev("gemm_fusion"), None),
    ],
)
def test_transfer_direction(event, expected):
    assert T.transfer_direction(event) == expected


def test_transfer_bytes_from_memcpy_details_or_bytes_arg():
    assert (
        T.transfer_bytes(
            _ev("MemcpyD2H", memcpy_details="kind_src:device kind_dst:pinned size:4096 dest:0")
        )
        == 4096
    )
    assert T.transfer_bytes(_ev("MemcpyD2H", bytes="123")) == 123
    assert T.transfer_bytes(_ev("MemcpyD2H")) == 0


# --- the synthetic GPU trace: exact numbers ---------------------------------------------------


@pytest.fixture(scope="module")
def gpu():
    return T.analyze_trace(GPU)


def test_synthetic_gpu_trace_step_0(gpu):
    assert gpu.backend == "gpu" and gpu.transfers_observed
    s0 = next(s for s in gpu.steps if s.step == 0)
    assert s0.device == "/device:GPU:0"
    assert s0.wall_s == pytest.approx(950 * US)
    # Kernels [1100,1400] and [1450,1900]; the warm-up kernel before the first step and the
    # derived "XLA Ops" line (which would give 850 µs) are not counted.
    assert s0.compute_s == pytest.approx(750 * US)
    # D2H [1300,1500]: under compute [1300,1400] and [1450,1500] → 150 µs overlapped, 50 exposed.
    assert (s0.d2h.busy_s, s0.d2h.overlap_s, s0.d2h.exposed_s) == pytest.approx(
        (200 * US, 150 * US, 50 * US)
    )
    assert s0.d2h.bytes == 4_000_000 and s0.d2h.bandwidth_bytes_per_s == pytest.approx(20e9)
    # H2D [1850,1950]: 50 µs under the second kernel.
    assert (s0.h2d.busy_s, s0.h2d.overlap_s, s0.h2d.exposed_s) == pytest.approx(
        (100 * US, 50 * US, 50 * US)
    )
    assert s0.h2d.bytes == 2_000_000 and s0.h2d.bandwidth_bytes_per_s == pytest.approx(20e9)
    assert (s0.transfer_s, s0.overlap_s, s0.exposed_s) == pytest.approx(
        (300 * US, 200 * US, 100 * US)
    )
    # The host's cuMemcpyDtoHAsync API call is not a transfer.
    assert s0.d2h.copies == 1


def test_synthetic_gpu_trace_step_1(gpu):
    s1 = next(s for s in gpu.steps if s.step == 1)
    assert s1.wall_s == pytest.approx(900 * US)
    assert s1.compute_s == pytest.approx(
        500 * US
    )  # the memset and the device→device copy are not compute
    # Two D2H copies overlapping each other: union [2100,2400], 6 MB → 20 GB/s, all under compute.
    assert (s1.d2h.busy_s, s1.d2h.overlap_s, s1.d2h.exposed_s) == pytest.approx(
        (300 * US, 300 * US, 0.0)
    )
    assert s1.d2h.bytes == 6_000_000 and s1.d2h.bandwidth_bytes_per_s == pytest.approx(20e9)
    assert (s1.h2d.busy_s, s1.h2d.overlap_s, s1.h2d.exposed_s) == pytest.approx(
        (100 * US, 0.0, 100 * US)
    )
    assert s1.h2d.bandwidth_bytes_per_s == pytest.approx(10e9)
    assert (s1.transfer_s, s1.overlap_s, s1.exposed_s) == pytest.approx(
        (400 * US, 300 * US, 100 * US)
    )


def test_synthetic_gpu_trace_summary_and_notes(gpu):
    s = gpu.summary()
    assert s["steps"] == 2
    assert s["compute_s"] == pytest.approx(625 * US)
    assert s["exposed_transfer_s"] == pytest.approx(100 * US)
    assert s["d2h_bandwidth_bytes_per_s"] == pytest.approx(10e6 / 500e-6)
    assert any("2 device↔device copies or memsets" in n for n in gpu.notes)
    assert not any("CPU backend" in n for n in gpu.notes)
    json.dumps(gpu.to_json())


def test_synthetic_gpu_timeline_of_one_step():
    events, _ = T.load_events(GPU)
    lanes, step, origin = T.timeline(events, step=1)
    assert step == 1 and origin == 2000
    assert lanes["compute"] == [pytest.approx((0.1, 0.5))]
    assert lanes["device→host"] == [pytest.approx((0.1, 0.3))]
    assert lanes["host→device"] == [pytest.approx((0.65, 0.1))]
    with pytest.raises(TieraxError, match="step 7 is not in the trace"):
        T.timeline(events, step=7)


def test_without_step_annotations_the_trace_is_one_step():
    events, _ = T.load_events(GPU)
    bare = [e for e in events if e.name != T.STEP_ANNOTATION and "step_num" not in e.args]
    a = T.analyze(bare)
    assert [s.step for s in a.steps] == [-1]
    # Everything counts now, the warm-up kernel too: 200 + 750 + 500 µs.
    assert a.steps[0].compute_s == pytest.approx(1450 * US)
    assert any("whole trace is analysed as one step" in n for n in a.notes)


# --- the recorded CPU trace -------------------------------------------------------------------


def _independent_cpu_compute(path) -> dict[int, float]:
    """Per-step compute seconds straight from the raw JSON: a sweep over XLA-op boundaries."""
    raw = json.load(gzip.open(path))["traceEvents"]
    steps = sorted(
        (e["ts"], int(e["args"]["step_num"])) for e in raw if e.get("name") == T.STEP_ANNOTATION
    )
    ops = [
        (e["ts"], e["ts"] + e["dur"])
        for e in raw
        if e.get("ph") == "X"
        and "hlo_op" in e.get("args", {})
        and not e["name"].startswith("end: ")
    ]
    out = {}
    for i, (start, step) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        edges = sorted({t for a, b in ops if start <= a < end for t in (a, b)})
        covered = sum(
            hi - lo
            for lo, hi in zip(edges, edges[1:], strict=False)
            if any(a <= lo and hi <= b for a, b in ops if start <= a < end)
        )
        out[step] = covered * 1e-6
    return out


def test_recorded_cpu_trace_compute_and_no_transfers():
    a = T.analyze_trace(CPU)  # the directory: finds perfetto_trace.json.gz
    assert a.source.endswith("perfetto_trace.json.gz")
    assert a.backend == "cpu" and not a.transfers_observed
    assert T.CPU_NOTE in a.notes
    expected = json.loads((CPU / "expected.json").read_text())["steps"]
    independent = _independent_cpu_compute(CPU / "perfetto_trace.json.gz")
    assert [s.step for s in a.steps] == [0, 1] == sorted(independent)
    for s, e in zip(a.steps, expected, strict=False):
        assert s.compute_s == pytest.approx(e["compute_s"], abs=1e-9)
        assert s.compute_s == pytest.approx(independent[s.step], abs=1e-9)
        assert 0 < s.compute_s < s.wall_s
        assert s.h2d.copies == s.d2h.copies == 0 and s.exposed_s == 0.0
        assert s.h2d.bandwidth_bytes_per_s is None


def test_recorded_cpu_xplane_agrees_with_perfetto_json():
    from_json = T.analyze_trace(CPU / "perfetto_trace.json.gz")
    from_xplane = T.analyze(T.events_from_xplane(CPU / "host.xplane.pb"))
    assert [s.step for s in from_xplane.steps] == [s.step for s in from_json.steps]
    for x, j in zip(from_xplane.steps, from_json.steps, strict=False):
        assert x.compute_s == pytest.approx(j.compute_s, abs=1e-8)  # JSON keeps µs to 3 decimals
        assert x.wall_s == pytest.approx(j.wall_s, abs=1e-8)


def test_fixtures_stay_small():
    assert sum(f.stat().st_size for f in CPU.iterdir()) < 1_000_000


# --- bad input ---------------------------------------------------------------------------------


def test_directory_without_trace_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("no trace here")
    with pytest.raises(TieraxError, match="holds no trace"):
        T.analyze_trace(tmp_path)
    with pytest.raises(TieraxError, match="no such file or directory"):
        T.analyze_trace(tmp_path / "missing")


def test_damaged_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "perfetto_trace.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(TieraxError, match="could not be read"):
        T.analyze_trace(tmp_path)
    (tmp_path / "perfetto_trace.json.gz").unlink()
    (tmp_path / "x.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": 3}'))
    with pytest.raises(TieraxError, match="traceEvents"):
        T.analyze_trace(tmp_path)


# --- the profile verb (one real capture on CPU) -------------------------------------------------


def test_profile_refuses_a_non_empty_out_and_deletes_nothing(cli, tmp_path):
    out = tmp_path / "prof"
    out.mkdir()
    (out / "keep.txt").write_text("the user's file")
    r = cli("profile", "--model", "tiny-llama", "--out", str(out))
    assert r.returncode == 2 and "not empty; nothing in it is deleted" in r.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (
        out / "keep.txt"
    ).read_text() == "the user's file"


def test_profile_default_out_never_replaces_an_earlier_profile(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / "profiles" / "tiny-llama-qkv-offload"
    earlier.mkdir(parents=True)
    (earlier / "profile.json").write_text("{}")
    assert profile_lib.fresh_dir(earlier) == earlier.with_name("tiny-llama-qkv-offload-2")
    assert profile_lib.fresh_dir(tmp_path / "profiles" / "new") == tmp_path / "profiles" / "new"


@pytest.mark.slow  # a profiled run
def test_profile_verb_writes_trace_and_analysis(cli, tmp_path):
    out = tmp_path / "prof"
    out.mkdir()  # an empty directory may be given
    r = cli(
        "profile",
        "--model",
        "tiny-llama",
        "--plan",
        "qkv-offload",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--microbatch",
        "2",
        "--seq",
        "16",
        "--out",
        str(out),
        "--json",
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 0
    assert doc == json.loads(
        (out / "profile.json").read_text()
    )  # --json prints the record it wrote
    r = cli(
        "profile",
        "--model",
        "tiny-llama",
        "--plan",
        "qkv-offload",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--microbatch",
        "2",
        "--seq",
        "16",
        "--out",
        str(tmp_path / "prof2"),
    )
    text = r.stdout
    assert r.returncode == 0
    doc = json.loads((out / "profile.json").read_text())
    assert (
        doc["schema"] == PROFILE_SCHEMA
        and doc["jax_version"]
        and doc["machine"]["platform"] == "cpu"
    )
    assert doc["analysis"]["backend"] == "cpu" and doc["analysis"]["transfers_observed"] is False
    assert [s["step"] for s in doc["analysis"]["steps"]] == [0, 1]
    assert doc["memory"]["runtime"] is None and doc["memory"]["compiled"]["peak"] > 0
    assert list(out.rglob("perfetto_trace.json.gz")) and list(out.rglob("*.xplane.pb"))
    assert "no host↔device transfers" in text and "ui.perfetto.dev" in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_profile_unknown_plan_exits_2_and_writes_nothing(cli, tmp_path):
    out = tmp_path / "prof"
    r = cli("profile", "--model", "tiny-llama", "--plan", "qkv-ofload", "--out", str(out))
    assert r.returncode == 2
    assert "neither a preset" in r.stderr
    assert not out.exists()
