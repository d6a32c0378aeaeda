"""The cost model's default TPU rates are the kernel rates measured on a v5e chip: the package data
file is what bench/tpu_kernel_rates.py extracts from the committed chip records, each v5e rate is
its record's, every other generation's is the v5e share of the datasheet times its own, the splash
kernel interpolates between the measured shapes, and the sources name the record.  Reads files
and the cost model's rates only; nothing is compiled."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import pathlib
import sys
from types import SimpleNamespace

import pytest

from tierax import costmodel as cm
from tierax import hardware
from tierax import plan as plan_lib
from tierax.costmodel.rates import attention_at
from tierax.costmodel.resources import scale_rates
from tierax.hardware import tpu_rates
from tierax.tracing.model_program import FusedAttention

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD_PATH = ROOT / "bench/results/tpu_kernel_rates.json"
RECORD = json.loads(RECORD_PATH.read_text())
RATES = RECORD["rates"]
GEMM = {g["min_dim"]: g for g in RATES["gemm"]}
SPLASH = {(c["seq"], c["head_dim"]): c for c in RATES["splash"]}
V5E_PEAK, V5E_HBM = 197e12, 819e9
CITED = "bench/results/tpu_kernel_rates.json"


def _script():
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))  # the script imports _common as a sibling
    spec = importlib.util.spec_from_file_location(
        "tpu_kernel_rates_script", ROOT / "bench" / "tpu_kernel_rates.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extracted() -> tuple:
    mod = _script()
    k, b = RATES["kernels_from"]["record"], RATES["host_link_from"]["record"]
    h = RATES["host_link"]["round_trip"]["from"]["record"]
    rates = mod.extract(
        mod._chip_record(ROOT / k),
        ROOT / k,
        mod._chip_record(ROOT / h),
        ROOT / h,
        mod.published_rates(),
        mod.link_beside_record(ROOT / b),
        ROOT / b,
    )
    w = ROOT / RATES["sweep_from"]["record"]
    rates = mod.merge_sweep(rates, mod.sweep_record(w), w)
    rates["indexed"] = mod.indexed_record(ROOT / RATES["indexed"]["from"]["record"])
    return mod, rates


def _prog(seq: int, head_dim: int) -> SimpleNamespace:
    return SimpleNamespace(seq=seq, attention=FusedAttention("splash", 8, head_dim))


def test_the_record_and_the_package_data_are_what_the_script_extracts_from_the_chip_records():
    mod, rates = _extracted()
    assert RATES == rates  # no figure typed by hand or left stale
    assert mod.package_data(rates) == tpu_rates.data()
    assert (ROOT / "src/tierax/hardware" / tpu_rates.DATA_FILE).read_text() == mod.data_text(rates)
    # the rates as the chip records hold them (the calibration tierax calibrate stored there, and
    # the sweep of the shapes it did not measure: the rows marked with its record)
    chip = json.loads((ROOT / RATES["kernels_from"]["record"]).read_text())["calibration"]
    sweep = json.loads((ROOT / RATES["sweep_from"]["record"]).read_text())
    assert [[g["min_dim"], g["flops_per_s"]] for g in RATES["gemm"] if "from" not in g] == chip[
        "matmul_size_rates_bfloat16"
    ]
    small = {g["min_dim"]: g["flops_per_s"] for g in sweep["gemm"]}
    swept = [g for g in RATES["gemm"] if "from" in g]
    assert swept and all(g["flops_per_s"] == small[g["min_dim"]] for g in swept)
    assert max(g["min_dim"] for g in swept) < min(d for d, _ in chip["matmul_size_rates_bfloat16"])
    rows = [
        [c["seq"], c["head_dim"], c["fwd_flops_per_s"], c["bwd_flops_per_s"]]
        for c in RATES["splash"]
        if "from" not in c
    ]
    assert sorted(rows) == sorted(chip["splash_attention"])
    by_shape = {(r["seq"], r["head_dim"]): r for r in sweep["splash"] if "error" not in r}
    for c in RATES["splash"]:
        if "from" in c:
            r = by_shape[(c["seq"], c["head_dim"])]
            assert (c["fwd_flops_per_s"], c["bwd_flops_per_s"]) == (
                r["fwd_flops_per_s"],
                r["bwd_flops_per_s"],
            )
    assert sweep["device"]["device_kind"] == "TPU v5 lite" and not sweep["tiny"]
    assert RATES["kernels_from"]["device_kind"] == "TPU v5 lite" and RATES["target"] == "v5e"
    # the gathers' and scatters' rates as bench/tpu_indexed.py measured them on the chip
    idx = json.loads((ROOT / RATES["indexed"]["from"]["record"]).read_text())
    assert idx["device"]["device_kind"] == "TPU v5 lite"
    assert tpu_rates.data()["index_op_s"] == idx["indexed"]["index_op_s"]
    assert tpu_rates.data()["scatter_bytes_per_s"] == idx["indexed"]["scatter_bytes_per_s"]


def test_gather_and_scatter_rates_of_a_cpu_run_are_refused(tmp_path):
    """A bench/tpu_indexed.py record made off the chip (its CPU rehearsal) never becomes a TPU
    default: the extraction says where it was measured and how to measure it on the chip."""
    mod = _script()
    doc = json.loads((ROOT / RATES["indexed"]["from"]["record"]).read_text())
    doc["device"]["platform"] = "cpu"
    bad = tmp_path / "cpu.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="measured on 'cpu', not a TPU.*on the chip"):
        mod.indexed_record(bad)
    assert tpu_rates.for_target(hardware.TPU_TARGETS["v5p"], "bfloat16").index_op_s == 0.0
    v5e = tpu_rates.for_target(hardware.TPU_TARGETS["v5e"], "bfloat16")
    assert v5e.index_op_s == doc["indexed"]["index_op_s"] and "per index" in v5e.sources["indexed"]


def test_the_record_says_what_it_did_not_measure():
    """Every splash shape the table asks for is measured, or named as missing or refused; the
    GEMMs below the smallest measured dimension are named."""
    mod = _script()
    missing = RATES["not_measured"]
    refused = {(s, d) for s, d, _ in missing.get("splash_refused", [])}
    for seq in mod.WANTED_SEQS:
        for hd in mod.WANTED_HEAD_DIMS:
            named = [seq, hd] in missing["splash_causal"] or (seq, hd) in refused
            assert ((seq, hd) in SPLASH) != named, (seq, hd)
    assert missing["gemm_min_dim_below"] == min(GEMM) == 16
    assert "splash_non_causal" in missing
    assert missing["other_generations"] == ["v5p", "v6e", "v7x"]


def test_shapes_measured_in_both_runs_agree():
    """The sweep measures the calibration's shapes again by the same method in another process:
    the two runs agree within 3 % (the chip's run-to-run spread), so its rows join the table as
    the same kind of figure."""
    twice = [c for c in RATES["splash"] if "second_run" in c]
    assert len(twice) == 5
    for c in twice:
        for k in ("fwd_flops_per_s", "bwd_flops_per_s"):
            assert c["second_run"][k] == pytest.approx(c[k], rel=0.03), (c["seq"], c["head_dim"])
    assert GEMM[128]["second_run_flops_per_s"] == pytest.approx(GEMM[128]["flops_per_s"], rel=0.03)


def test_a_sweep_made_off_the_chip_is_refused(tmp_path):
    mod = _script()
    doc = json.loads((ROOT / RATES["sweep_from"]["record"]).read_text())
    for change in ({"device": {"platform": "cpu", "device_kind": "cpu"}}, {"tiny": True}):
        bad = tmp_path / "sweep.json"
        bad.write_text(json.dumps(doc | change))
        with pytest.raises(
            ValueError, match="a rehearsal.*run bench/tpu_kernel_sweep.py on the chip"
        ):
            mod.sweep_record(bad)


def test_v5e_default_rates_are_the_records():
    r = cm.target_rates("v5e", "bfloat16", calibration={})
    assert r.matmul_flops_per_s == pytest.approx(GEMM[2048]["flops_per_s"], rel=1e-12)
    for dim, g in GEMM.items():
        assert r.matmul_rate_at(dim) == pytest.approx(g["flops_per_s"], rel=1e-12)
    assert r.matmul_rate_at(8) == pytest.approx(GEMM[16]["flops_per_s"], rel=1e-12)  # nearest
    assert r.hbm_bytes_per_s == pytest.approx(RATES["nonmatmul"]["bytes_per_s"], rel=1e-12)
    link = RATES["host_link"]
    assert (r.d2h_bytes_per_s, r.h2d_bytes_per_s) == (
        link["d2h_bytes_per_s"],
        link["h2d_bytes_per_s"],
    )
    for (seq, hd), c in SPLASH.items():
        at = cm.for_program(r, _prog(seq, hd))
        assert at.fused_attention_fwd_flops_per_s == pytest.approx(c["fwd_flops_per_s"], rel=1e-12)
        assert at.fused_attention_bwd_flops_per_s == pytest.approx(c["bwd_flops_per_s"], rel=1e-12)
    for key in ("matmul", "matmul_by_size", "fused_attention", "hbm", "host_link"):
        assert CITED in r.sources[key] and "TPU v5 lite" in r.sources[key], key
    assert "no v5e chip measured" not in r.sources["matmul"]
    assert "GPU share" not in " ".join(r.sources.values())


@pytest.mark.parametrize("key", ["v5p", "v6e", "v7x"])
def test_other_generations_take_the_v5e_efficiencies_times_their_datasheet(key):
    spec = hardware.get_target(key)
    peak = spec.peak("bfloat16")
    r = cm.target_rates(key, "bfloat16", calibration={})
    if key != "v7x":  # v7x's GEMMs: Google's published table (the test below)
        for dim, g in GEMM.items():
            want = g["flops_per_s"] / V5E_PEAK * peak
            assert r.matmul_rate_at(dim) == pytest.approx(want, rel=1e-12)
        assert r.matmul_flops_per_s == pytest.approx(GEMM[2048]["efficiency"] * peak, rel=1e-12)
    eff = RATES["nonmatmul"]["bytes_per_s"] / V5E_HBM
    assert r.hbm_bytes_per_s == pytest.approx(eff * spec.hbm_bytes_per_s, rel=1e-12)
    assert r.d2h_bytes_per_s == spec.host_link_bps  # no host link scaled from v5e's
    c = SPLASH[(8192, 64)]
    at = cm.for_program(r, _prog(8192, 64))
    assert at.fused_attention_fwd_flops_per_s == pytest.approx(
        c["fwd_efficiency"] * peak, rel=1e-12
    )
    assert at.fused_attention_bwd_flops_per_s == pytest.approx(
        c["bwd_efficiency"] * peak, rel=1e-12
    )
    said = (
        f"v5e efficiency measured on the chip, scaled by {key}'s datasheet; no {key} chip measured"
    )
    scaled = ("fused_attention", "hbm") if key == "v7x" else ("matmul", "matmul_by_size")
    for source in (*scaled, "fused_attention", "hbm"):
        assert said in r.sources[source] and CITED in r.sources[source], source


def test_v7x_gemms_take_googles_published_large_gemm_share_by_hand():
    """Google published v7x's square bf16 GEMMs (bench/data/tpu_published_rates.yaml): the rate
    stops growing at m = n = k = 16384 (950.13 TFLOP/s per device, within 1 % of 32768's 956.38;
    4096's 892.94 is not), so v7x's GEMMs at a step's shapes run at 950.13 TFLOP/s and each
    smallest-dimension point at the v5e chip's share times 950.13 / 1153.5 over 186.06 / 197."""
    import yaml

    pub = yaml.safe_load((ROOT / "bench/data/tpu_published_rates.yaml").read_text())["v7x"]
    table = [(m, t * 1e12) for m, t in pub["gemm"]["tflops_by_size"]]
    assert tpu_rates.large_gemm_rate(table) == (16384, 950.1286983e12)
    assert tpu_rates.large_gemm_rate([(1, 1.0), (2, 2.0), (3, 2.01)]) == (2, 2.0)
    r = cm.target_rates("v7x", "bfloat16", calibration={})
    assert r.matmul_flops_per_s == pytest.approx(950.1286983e12, rel=1e-12)
    peak = 2307e12 / 2  # per device: half a chip
    scale = (950.1286983e12 / peak) / (GEMM[2048]["flops_per_s"] / V5E_PEAK)
    for dim, g in GEMM.items():
        want = g["flops_per_s"] / V5E_PEAK * scale * peak
        assert r.matmul_rate_at(dim) == pytest.approx(want, rel=1e-12)
    assert r.fp8_matmul_flops_per_s == pytest.approx(950.1286983e12 / peak * 4614e12 / 2)
    assert "ee16a1c86c4c81584ed217df974544f6b6e9661c" in r.sources["matmul"]
    assert "no v7x chip measured" in r.sources["matmul_by_size"]
    assert "published for v7x" in r.sources["fp8_matmul"]
    # the other generations keep the v5e share: no table published for them
    assert cm.target_rates("v6e", "bfloat16", calibration={}).matmul_flops_per_s == pytest.approx(
        GEMM[2048]["flops_per_s"] / V5E_PEAK * 918e12
    )


def test_a_published_table_is_refused_for_an_unknown_target_or_kind(tmp_path):
    mod = _script()
    bad = tmp_path / "p.yaml"
    bad.write_text("v9z:\n  gemm: {}\n")
    with pytest.raises(ValueError, match="v9z"):
        mod.published_rates(bad)
    bad.write_text("v7x:\n  hbm: {}\n")
    with pytest.raises(ValueError, match="unknown kind"):
        mod.published_rates(bad)


def test_v6e_matmul_is_the_v5e_share_times_v6es_peak_by_hand():
    r = cm.target_rates("v6e", "bfloat16", calibration={})
    # 186.06 of 197 measured on v5e → that share of v6e's 918 TFLOP/s
    assert r.matmul_flops_per_s == pytest.approx(GEMM[2048]["flops_per_s"] / 197e12 * 918e12)
    assert r.matmul_rate_at(128) == pytest.approx(GEMM[128]["flops_per_s"] / 197e12 * 918e12)


def test_fp8_gemms_of_a_tpu_with_an_fp8_peak_take_the_bf16_share_by_size():
    r = cm.target_rates("v7x", "bfloat16", calibration={})
    share = 950.1286983e12 / (2307e12 / 2)  # v7x's published bf16 large-GEMM share
    assert r.fp8_matmul_flops_per_s == pytest.approx(share * 2307e12, rel=1e-12)
    # v5p lists its bf16 peak for fp8 too: the v5e chip's share of it
    v5p = cm.target_rates("v5p", "bfloat16", calibration={})
    assert v5p.fp8_matmul_flops_per_s == pytest.approx(GEMM[2048]["efficiency"] * 459e12)
    shares = ((128, 0.5), (2048, 0.5))
    blended = r.blended_matmul_rate(shares) / r.matmul_size_rates[-1][1]
    assert r.blended_fp8_rate(shares) == pytest.approx(share * 2307e12 * blended, rel=1e-12)
    assert cm.target_rates("v6e", "bfloat16", calibration={}).fp8_matmul_flops_per_s == 0.0


def test_splash_between_and_beyond_the_measured_shapes_by_hand():
    r = cm.target_rates("v5e", "bfloat16", calibration={})
    c4, c8 = SPLASH[(4096, 128)], SPLASH[(8192, 128)]
    seq = 6000  # linear in log seq between 4096 and 8192
    t = math.log(seq / 4096) / math.log(2)
    at = cm.for_program(r, _prog(seq, 128))
    want = c4["fwd_flops_per_s"] + t * (c8["fwd_flops_per_s"] - c4["fwd_flops_per_s"])
    assert at.fused_attention_fwd_flops_per_s == pytest.approx(want, rel=1e-12)
    # head dim 96 at seq 2048: halfway between the head dims 64 and 128
    lo, hi = SPLASH[(2048, 64)], SPLASH[(2048, 128)]
    at = cm.for_program(r, _prog(2048, 96))
    want = (lo["bwd_flops_per_s"] + hi["bwd_flops_per_s"]) / 2
    assert at.fused_attention_bwd_flops_per_s == pytest.approx(want, rel=1e-12)
    # head dim 160 at seq 2896 (√(2048·4096)): the midpoint of four measured shapes
    at = cm.for_program(r, _prog(2896, 160))
    corners = [SPLASH[(s, d)]["fwd_flops_per_s"] for s in (2048, 4096) for d in (128, 192)]
    assert at.fused_attention_fwd_flops_per_s == pytest.approx(sum(corners) / 4, rel=2e-4)
    # beyond: seq 65536 and head dim 256 take the nearest measured point, and say so
    far = SPLASH[(32768, 192)]
    at = cm.for_program(r, _prog(65536, 256))
    assert at.fused_attention_fwd_flops_per_s == pytest.approx(far["fwd_flops_per_s"], rel=1e-12)
    assert "beyond the measured ones" in at.sources["fused_attention"]
    assert cm.for_program(at, _prog(2048, 64)) is at  # resolved once


def test_an_attention_factor_and_a_given_rate_survive_the_programs_shape():
    r = cm.target_rates("v5e", "bfloat16", calibration={})
    slow = scale_rates(r, {"attention": 2.0})
    at = cm.for_program(slow, _prog(8192, 128))
    assert at.fused_attention_fwd_flops_per_s == pytest.approx(
        SPLASH[(8192, 128)]["fwd_flops_per_s"] / 2, rel=1e-12
    )
    given = cm.override_rates(r, ["fused_attention_fwd=50"])
    assert cm.for_program(given, _prog(8192, 128)).fused_attention_fwd_flops_per_s == 50e12


def test_a_calibration_on_the_target_replaces_the_chip_defaults():
    cal = {
        "v6e": {
            "created": "t",
            "matmul_flops_per_s_bfloat16": 800e12,
            "splash_attention": [[4096, 128, 300e12, 250e12]],
            "memory_bytes_per_s": 1.5e12,
        }
    }
    r = cm.target_rates("v6e", "bfloat16", calibration=cal)
    assert r.matmul_flops_per_s == 800e12 and r.matmul_size_rates[-1][1] == pytest.approx(800e12)
    # the measured shares by size keep their shape under the calibrated rate
    want = 800e12 * GEMM[128]["flops_per_s"] / GEMM[2048]["flops_per_s"]
    assert r.matmul_rate_at(128) == pytest.approx(want, rel=1e-12)
    assert r.hbm_bytes_per_s == 1.5e12 and "measured by tierax calibrate" in r.sources["hbm"]
    at = cm.for_program(r, _prog(8192, 64))
    assert at.fused_attention_fwd_flops_per_s == 300e12  # the one measured case, nearest
    assert "measured by tierax calibrate" in r.sources["fused_attention"]


def test_simulate_prints_the_records_sources_for_v5e(cli):
    r = cli(
        "simulate",
        "--model",
        "tiny-llama",
        "--target",
        "v5e",
        "--microbatch",
        "2",
        "--seq",
        "256",
        "--plan",
        "remat-full",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join((r.stdout + r.stderr).split())
    assert f"186.1 of 197 TFLOP/s on one TPU v5 lite chip (v5e, jax 0.10.2; {CITED})" in text
    assert "splash attention (causal) forward / backward" in text
    assert "GPU share assumed" not in text


def test_the_data_file_is_refused_in_another_format(monkeypatch):
    class Other:
        def joinpath(self, name):
            return self

        def read_text(self, encoding):
            return json.dumps({"format": "other"})

    tpu_rates.data.cache_clear()
    monkeypatch.setattr(tpu_rates.resources, "files", lambda package: Other())
    try:
        with pytest.raises(ValueError, match="format 'other'"):
            tpu_rates.data()
    finally:
        monkeypatch.undo()
        tpu_rates.data.cache_clear()


def test_a_splash_program_is_priced_at_its_own_shape():
    """tierax's own program names its splash kernel's shape, so the time model takes the measured
    rates at its sequence and head dim (not the reference shape's), and adds no workspace."""
    from tierax.models import apply_overrides, get_config
    from tierax.tracing.model_program import program_of

    cfg = apply_overrides(get_config("tiny-llama"), ["attention=splash", "dtype=bfloat16"])
    prog = program_of(cfg, 2, 256)
    _, dqk, _ = cfg.attention_dims()
    assert prog.attention == FusedAttention("splash", cfg.num_heads, dqk)
    r = cm.target_rates("v5e", "bfloat16", calibration={})
    at = cm.for_program(r, prog)
    want = attention_at(r.fused_attention_table, 256, dqk)
    assert (at.fused_attention_fwd_flops_per_s, at.fused_attention_bwd_flops_per_s) == want
    assert want[0] != r.fused_attention_fwd_flops_per_s  # not the reference shape's rate
    base = cm.simulate(plan_lib.preset("remat-full", cfg), prog, r, "lhs", 1)
    unshaped = cm.simulate(
        plan_lib.preset("remat-full", cfg), dataclasses.replace(prog, attention=None), r, "lhs", 1
    )
    assert base.peak_device_bytes == unshaped.peak_device_bytes  # no workspace for splash
    assert base.step_time_s != unshaped.step_time_s


def test_the_host_link_is_the_rate_beside_compute_past_the_hidden_sizes():
    """The cost model's v5e host link is the chip's link beside compute: the bytes a prefetching
    scan's stores and loads move (every layer's but the last, each way) over the time they add,
    between the two sizes past the smallest (whose copies the layers' compute hid), computed here
    from the record's rows; the round trip's rate (little compute beside it) is kept, higher."""
    beside = json.loads((ROOT / RATES["host_link_from"]["record"]).read_text())
    assert beside["device_kind"] == "TPU v5 lite" and beside["platform"] == "tpu"
    rows = beside["splits"]["1"]["rows"]
    layers = beside["shape"]["layers"]
    assert rows[0]["added_s"] < 0.002  # hidden: the layers' compute covers the smallest
    (a, b) = rows[1], rows[2]
    moved = 2 * (layers - 1) * (b["layer_bytes"] - a["layer_bytes"])
    rate = moved / (b["added_s"] - a["added_s"])
    r = cm.target_rates("v5e", "bfloat16", calibration={})
    assert r.d2h_bytes_per_s == pytest.approx(rate, rel=1e-9)
    assert r.h2d_bytes_per_s == pytest.approx(rate, rel=1e-9)
    assert "beside compute" in r.sources["host_link"]
    trip = RATES["host_link"]["round_trip"]
    assert trip["d2h_bytes_per_s"] > rate
    # without the record, the round trip's
    mod = _script()
    k = RATES["kernels_from"]["record"]
    h = trip["from"]["record"]
    plain = mod.extract(mod._chip_record(ROOT / k), ROOT / k, mod._chip_record(ROOT / h), ROOT / h)
    assert plain["host_link"]["d2h_bytes_per_s"] == trip["d2h_bytes_per_s"]
    assert "round_trip" not in plain["host_link"]


def test_a_sweep_fills_what_the_calibration_lacks_and_keeps_what_it_measured():
    """By hand, on a made-up extraction and sweep: a new splash shape joins the table as the
    sweep measured it, a shape both measured keeps the calibration's figure (the sweep's beside
    it), a refused shape is named, a GEMM point below the smallest measured joins, and the
    sweep's figure at that smallest point is kept beside it, never taken."""
    mod = _script()
    peak = 197e12
    rates = {
        "datasheet": {"peak_flops_per_s": peak},
        "gemm": [{"min_dim": 128, "what": "smallest dimension", "flops_per_s": 90e12, "gemms": []}],
        "splash": [
            {"seq": 2048, "head_dim": 128, "fwd_flops_per_s": 68e12, "bwd_flops_per_s": 72e12}
        ],
        "not_measured": {"splash_causal": [[4096, 128], [2048, 192]], "gemm_min_dim_below": 128},
    }
    row = {"batch": 4, "heads": 16, "kv_heads": 8, "forward_flops": 1.0}
    sweep = {
        "command": "c", "created": "t", "jax_version": "j", "machine": {},
        "device": {"platform": "tpu", "device_kind": "TPU v5 lite"},
        "splash": [
            {"seq": 2048, "head_dim": 128, "fwd_flops_per_s": 70e12, "bwd_flops_per_s": 71e12,
             **row},
            {"seq": 4096, "head_dim": 128, "fwd_flops_per_s": 80e12, "bwd_flops_per_s": 79e12,
             "kernel_fwd_flops_per_s": 100e12, "kernel_bwd_flops_per_s": 90e12, **row},
            {"seq": 2048, "head_dim": 192, "error": "ValueError: head dim"},
        ],
        "gemm": [
            {"min_dim": 64, "flops_per_s": 45e12, "gemms": []},
            {"min_dim": 128, "flops_per_s": 91e12, "gemms": []},
        ],
    }  # fmt: skip
    out = mod.merge_sweep(rates, sweep, ROOT / "x.json")
    splash = {(c["seq"], c["head_dim"]): c for c in out["splash"]}
    assert splash[(2048, 128)]["fwd_flops_per_s"] == 68e12
    assert splash[(2048, 128)]["second_run"]["fwd_flops_per_s"] == 70e12
    new = splash[(4096, 128)]
    assert (new["fwd_flops_per_s"], new["bwd_flops_per_s"]) == (80e12, 79e12)
    assert new["fwd_efficiency"] == pytest.approx(80e12 / peak) and new["causal"] is True
    assert new["kernel_fwd_flops_per_s"] == 100e12 and (2048, 192) not in splash
    assert out["not_measured"]["splash_causal"] == [[2048, 192]]
    assert [s[:2] for s in out["not_measured"]["splash_refused"]] == [[2048, 192]]
    assert [(g["min_dim"], g["flops_per_s"]) for g in out["gemm"]] == [(64, 45e12), (128, 90e12)]
    assert out["gemm"][1]["second_run_flops_per_s"] == 91e12
    assert out["not_measured"]["gemm_min_dim_below"] == 64
