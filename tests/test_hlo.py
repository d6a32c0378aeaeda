"""The static overlap check on hand-written scheduled HLO with answers computed by hand.

Units chosen so that each 4 MiB transfer takes 1 ms alone on the link and each 1024³ f32 dot 1 ms.
"""

import gzip
import json
import pathlib

import pytest

from tierax.xla import hlo

MS = 1e-3
RATES = {"peak_flops": 2 * 1024**3 / MS, "hbm_bytes_per_s": 1e30, "host_link_bps": 4 * 1024**2 / MS}
A = "f32[1024,1024]{1,0}"
H = "f32[1024,1024]{1,0:S(5)}"


def _entry(body: str) -> str:
    return (
        "HloModule m, is_scheduled=true\n\n"
        f"ENTRY %main (p0: f32[1024,1024], p1: f32[1024,1024]) -> f32[1024,1024] {{\n"
        f"  %p0 = {A} parameter(0)\n  %p1 = {A} parameter(1)\n{body}}}\n"
    )


def _check(text):
    ts = {t.start: t for t in hlo.host_transfers(hlo.parse_module(text), **RATES)}
    return ts, hlo.overlap_summary(list(ts.values()))


def test_concurrent_stores_share_the_link():
    # Two 4 MiB stores under one 1 ms dot: 8 MiB need 2 ms of link, so 1 ms is exposed in total.
    # (Each alone would fit under the dot: a check that gave each the full link would say 0.)
    ts, ov = _check(
        _entry(
            f"  %sa = ({A}, {H}, u32[]) copy-start(%p0)\n"
            f"  %sb = ({A}, {H}, u32[]) copy-start(%p1)\n"
            f"  %d1 = {A} dot(%p0, %p1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
            f"  %da = {H} copy-done(%sa)\n"
            f"  %db = {H} copy-done(%sb)\n"
            f"  ROOT %d2 = {A} dot(%d1, %p1), lhs_contracting_dims={{1}}, "
            f"rhs_contracting_dims={{0}}\n"
        )
    )
    assert ts["sa"].direction == ts["sb"].direction == "d2h"
    assert ts["sa"].est_transfer_s == pytest.approx(MS) and ts[
        "sa"
    ].est_compute_between_s == pytest.approx(MS)
    assert ts["sa"].est_stall_s == pytest.approx(MS) and ts["sb"].est_stall_s == pytest.approx(
        0, abs=1e-12
    )
    assert ov["est_exposed_s"] == pytest.approx(MS) and ov["est_transfer_s"] == pytest.approx(
        2 * MS
    )


def test_hidden_and_exposed_add_up_to_the_transfer_time_when_transfers_share_the_link():
    # Two 4 MiB stores awaited with no compute between: they share the link, so the first done
    # waits 2 ms (longer than its own 1 ms alone) and the second none.  The link is busy 2 ms, all
    # of it exposed.
    ts, ov = _check(
        _entry(
            f"  %sa = ({A}, {H}, u32[]) copy-start(%p0)\n"
            f"  %sb = ({A}, {H}, u32[]) copy-start(%p1)\n"
            f"  %da = {H} copy-done(%sa)\n"
            f"  %db = {H} copy-done(%sb)\n"
            f"  ROOT %d2 = {A} dot(%p0, %p1), lhs_contracting_dims={{1}}, "
            "rhs_contracting_dims={0}\n"
        )
    )
    assert ts["sa"].est_stall_s == pytest.approx(2 * MS)
    assert ts["sb"].est_stall_s == pytest.approx(0, abs=1e-12)
    assert ov["est_transfer_s"] == pytest.approx(2 * MS)
    assert ov["est_exposed_s"] == pytest.approx(2 * MS)
    assert ov["est_hidden_s"] == pytest.approx(0, abs=1e-12)
    for part in (ov, *ov["by_direction"].values()):
        assert part["est_hidden_s"] + part["est_exposed_s"] == pytest.approx(part["est_transfer_s"])


# A 4 MiB store and a 4 MiB load issued before a 1 ms dot and awaited after it.
STORE_AND_LOAD = _entry(
    f"  %st = ({A}, {H}, u32[]) copy-start(%p0)\n"
    f"  %h = {H} parameter(2)\n"
    f"  %ld = ({H}, {A}, u32[]) copy-start(%h)\n"
    f"  %d1 = {A} dot(%p0, %p1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
    f"  %dst = {H} copy-done(%st)\n"
    f"  ROOT %dld = {A} copy-done(%ld)\n"
)


def test_a_store_and_a_load_do_not_compete():
    # The link is full duplex: a 1 ms store and a 1 ms load under a 1 ms dot are both hidden.
    ts, ov = _check(STORE_AND_LOAD)
    assert {t.direction for t in ts.values()} == {"d2h", "h2d"}
    assert ov["est_exposed_s"] == pytest.approx(0, abs=1e-12)
    assert ov["by_direction"]["h2d"]["est_transfer_s"] == pytest.approx(MS)


def _loop(body_lines: str, trips: int = 4) -> str:
    return (
        "HloModule m, is_scheduled=true\n\n"
        f"%cond (c: {A}) -> pred[] {{\n  %c = {A} parameter(0)\n  ROOT %t = pred[] "
        f"constant(true)\n}}\n\n%body (b: {A}) -> {A} {{\n  %b = {A} parameter(0)\n  %hb = {H} "
        f"parameter(1)\n{body_lines}}}\n\nENTRY %main (p0: f32[1024,1024]) -> f32[1024,1024] {{\n  "
        f"%p0 = {A} parameter(0)\n  ROOT %w = {A} while(%p0), condition=%cond, body=%body, "
        f'backend_config={{"known_trip_count":{{"n":"{trips}"}}}}\n}}\n'
    )


def test_a_load_awaited_right_after_it_is_issued_is_exposed_every_trip():
    ts, ov = _check(
        _loop(
            f"  %ls = ({H}, {A}, u32[]) copy-start(%hb)\n"
            f"  %ld = {A} copy-done(%ls)\n"
            f"  ROOT %d = {A} dot(%ld, %b), lhs_contracting_dims={{1}}, "
            f"rhs_contracting_dims={{0}}\n"
        )
    )
    (t,) = ts.values()
    assert t.executions == 4 and t.direction == "h2d"
    assert t.est_stall_s == pytest.approx(MS) and ov["est_exposed_s"] == pytest.approx(4 * MS)


def test_a_load_issued_one_iteration_ahead_is_hidden_in_steady_state():
    # The prefetch pattern: await the copy issued in the previous trip, issue the next one, then
    # compute.
    ts, ov = _check(
        _loop(
            f"  %ld = {A} copy-done(%ls)\n"
            f"  %ls = ({H}, {A}, u32[]) copy-start(%hb)\n"
            f"  ROOT %d = {A} dot(%ld, %b), lhs_contracting_dims={{1}}, "
            f"rhs_contracting_dims={{0}}\n"
        )
    )
    (t,) = ts.values()
    assert t.est_compute_between_s == pytest.approx(MS)  # the dot, across the iteration boundary
    assert t.est_stall_s == pytest.approx(0, abs=1e-12) and ov["est_exposed_s"] == pytest.approx(
        0, abs=1e-12
    )


def test_an_instruction_printed_over_several_lines_stays_in_its_computation():
    # XLA:TPU prints a Pallas kernel's kernel_metadata over lines that start at the first column,
    # one of them with "}}, metadata=..."; the computation goes on after it
    text = (
        "HloModule m, is_scheduled=true\n\n"
        "%body (p: f32[1024,1024]) -> f32[1024,1024] {\n"
        f"  %p = {A} parameter(0)\n"
        f'  %k = {A} custom-call(%p), custom_call_target="tpu_custom_call", '
        "frontend_attributes={kernel_metadata={\n"
        '"xprof_metadata":"{\\"block_q\\": 512}"\n'
        '}}, metadata={op_name="jit(step)/pallas_call"}\n'
        f"  ROOT %d = {A} dot(%k, %p), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
        "}\n\n"
        "ENTRY %main (p0: f32[1024,1024]) -> f32[1024,1024] {\n"
        f"  %p0 = {A} parameter(0)\n"
        f"  ROOT %c = {A} call(%p0), to_apply=%body\n"
        "}\n"
    )
    module = hlo.parse_module(text)
    assert [i.name for i in module.computations["body"]] == ["p", "k", "d"]
    assert module.roots["body"] == "d" and module.entry == "main"
    assert 'op_name="jit(step)/pallas_call"' in module.by_name["k"].attrs
    assert module.instruction_flops(module.by_name["d"]) == 2 * 1024**3


def test_tpu_convolutions_count_the_products_xla_counts():
    """XLA:TPU writes its matmuls as convolutions (a batch or a head dimension as a padded,
    strided or dilated window).  Every fusion of the chip's own compiles (chip_schedule.json's
    cases) that XLA's cost analysis puts above 1e11 FLOPs (the MLP and attention projections and
    their gradients, RoPE's rotation, the MoE expert GEMMs) is counted within 1 % of XLA's own
    figure, read from the chip's op profiles; counting every tap of a window (the padding and the
    dilation holes too) overstated the rotation 32-fold and the expert GEMMs 8-fold."""
    results = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results" / "chip"
    checked = 0
    for profile, hlo_file in (
        ("hd64_planned_ops.json", "chip_schedule.0.hlo.gz"),
        ("mlamoe_deepseek_mb16_ops.json", "chip_schedule.2.hlo.gz"),
    ):
        prof = json.loads((results / "profiles" / profile).read_text())
        text = gzip.decompress((results / "schedule" / hlo_file).read_bytes()).decode()
        module = hlo.parse_module(text)
        for line in prof["lines"]:
            if line["thread"] != "XLA Ops":
                continue
            for op in line["ops"]:
                ins = module.by_name.get(op["name"])
                xla = float(op["args"].get("model_flops", 0))
                if ins is None or ins.opcode == "while" or xla < 1e11:
                    continue
                assert module.instruction_flops(ins) == pytest.approx(xla, rel=0.01), op["name"]
                checked += 1
    assert checked >= 20


def test_a_windowed_convolution_counts_only_the_taps_on_its_input():
    """By hand: q = x·Wq as XLA:TPU wrote it on the chip — x [8, 2048, 2048, 1] (dims: window 0,
    batch, feature, window 1), Wq [32, 64, 2048, 1] (window 1, out, in, window 0), a 32-wide
    window over a size-1 dimension padded by 31 each side: each of the 8·2048·32·64 outputs reads
    one tap of 2048 inputs."""
    text = """HloModule m

ENTRY %e (x: bf16[8,2048,2048,1], w: bf16[32,64,2048,1]) -> bf16[8,2048,32,64] {
  %x = bf16[8,2048,2048,1]{1,2,3,0} parameter(0)
  %w = bf16[32,64,2048,1]{2,1,0,3} parameter(1)
  ROOT %c = bf16[8,2048,32,64]{1,3,2,0} convolution(%x, %w), WINDOW, dim_labels=0bf1_1oi0->0b1f
}
""".replace("WINDOW", "window={size=1x32 pad=0_0x31_31 rhs_reversal=0x1}")
    module = hlo.parse_module(text)
    assert module.instruction_flops(module.by_name["c"]) == 2 * 8 * 2048 * 32 * 64 * 2048


def test_a_tpu_loops_trips_come_from_its_condition():
    """XLA:TPU's compile writes no known trip count: the trips come from the condition (counter <
    8 from 0).  On the chip's own compile of the head-dim-64 plan, the host copies counted per step
    are the ones its op profile saw: 16 stores and 17 loads (bench/results/chip/profiles)."""
    results = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results" / "chip"
    text = gzip.decompress((results / "schedule" / "chip_schedule.0.hlo.gz").read_bytes()).decode()
    module = hlo.parse_module(text)
    assert set(module.trip_counts().values()) == {8}
    ts = hlo.host_transfers(module, **RATES)
    profile = json.loads((results / "profiles" / "hd64_planned_profile.json").read_text())
    (step, *_) = profile["analysis"]["steps"]
    counts = {d: sum(t.executions for t in ts if t.direction == d) for d in ("d2h", "h2d")}
    assert counts == {"d2h": step["d2h"]["copies"], "h2d": step["h2d"]["copies"]} == {
        "d2h": 16,
        "h2d": 17,
    }


def test_a_loop_counting_from_a_constant_runs_the_difference():
    text = """HloModule m

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[4])) -> (s32[], f32[4]) {
  %q = (s32[], f32[4]) parameter(0)
  %k = s32[] get-tuple-element(%q), index=0
  %one = s32[] constant(1)
  %j = s32[] add(%k, %one)
  %y = f32[4] get-tuple-element(%q), index=1
  ROOT %t = (s32[], f32[4]) tuple(%j, %y)
}

ENTRY %e (x: f32[4]) -> (s32[], f32[4]) {
  %x = f32[4] parameter(0)
  %two = s32[] constant(2)
  %init = (s32[], f32[4]) tuple(%two, %x)
  ROOT %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
}
"""
    assert hlo.parse_module(text).trip_counts() == {"body": 5}


def test_each_direction_runs_at_its_own_link_rate():
    # A 4 MiB store and a 4 MiB load under a 1 ms dot, the load's direction at half the rate: the
    # store takes 1 ms and hides, the load 2 ms and waits 1 ms past the dot.
    half = RATES | {"h2d_link_bps": RATES["host_link_bps"] / 2}
    ts = {t.start: t for t in hlo.host_transfers(hlo.parse_module(STORE_AND_LOAD), **half)}
    assert ts["st"].est_transfer_s == pytest.approx(MS) and ts["st"].est_stall_s == pytest.approx(0)
    assert ts["ld"].est_transfer_s == pytest.approx(2 * MS)
    assert ts["ld"].est_stall_s == pytest.approx(MS)
