"""What-if targets, --rate overrides and --sweep: the planner's frontier."""

import json
import pathlib

import pytest

from tierax import costmodel as cm
from tierax import hardware
from tierax.errors import TieraxError
from tierax.models import apply_overrides, get_config
from tierax.solving import planner, whatif
from tierax.tracing import inventory as inv_lib
from tierax.tracing.model_program import for_inventory


def test_rate_overrides_replace_the_named_rates_and_say_so():
    base = cm.target_rates("gb200", "bfloat16")
    r = whatif.override_rates(base, ["host_link=900", "hbm_size=288", "matmul=2000"])
    assert r.d2h_bytes_per_s == r.h2d_bytes_per_s == 900e9
    assert r.device_memory_bytes == 288 * 10**9 and isinstance(r.device_memory_bytes, int)
    assert r.matmul_flops_per_s == 2000e12
    assert r.hbm_bytes_per_s == base.hbm_bytes_per_s  # untouched
    # the source shown for the host link is the override now, not the datasheet's
    assert r.sources["host_link"] == "--rate host_link=900 (GB/s per direction, both ways)"
    assert r.sources["matmul"].startswith("--rate matmul=2000") and "hbm" in r.sources
    assert whatif.override_rates(base, ["d2h=10"]).h2d_bytes_per_s == base.h2d_bytes_per_s


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("hostlink=900", "unknown key 'hostlink'; valid keys: host_link (GB/s per direction"),
        ("host_link", "expected KEY=VALUE"),
        ("host_link=-5", "expected a finite number > 0"),
        ("matmul=nan", "expected a finite number > 0"),
    ],
)
def test_bad_rate_overrides(text, fragment):
    with pytest.raises(TieraxError, match=fragment.replace("(", r"\(")):
        whatif.override_rates(cm.target_rates("h200", "bfloat16"), [text])


def test_sweep_points_and_bad_sweeps():
    assert whatif.parse_sweep("host_link=100:1000:300") == (
        "host_link",
        [100.0, 400.0, 700.0, 1000.0],
    )
    assert whatif.parse_sweep("microbatch=1:4:1")[1] == [1.0, 2.0, 3.0, 4.0]
    for text, fragment in [
        ("host_link=900:100:100", "no points"),
        ("speed=1:2:1", "KEY one of budget"),
        ("budget=1:2", "LO:HI:STEP"),
        ("microbatch=1:2:0.5", "whole numbers"),
    ]:
        with pytest.raises(TieraxError, match=fragment):
            whatif.parse_sweep(text)


def test_projections_are_marked_and_refused_for_compile():
    for key in ("gb300", "vr200"):
        spec = hardware.get_target(key)
        assert not spec.xla_described and "projection" in spec.name
        with pytest.raises(TieraxError, match="is a projection"):
            hardware.compile_target(key)
    assert hardware.compile_target("gb200").xla_described
    # Announced differences that matter to the planner: more HBM than GB200; VR200 doubles the C2C
    # link.
    gb200, gb300, vr200 = (hardware.get_target(k) for k in ("gb200", "gb300", "vr200"))
    assert gb300.device_memory_bytes > gb200.device_memory_bytes
    assert vr200.host_link_theory_bps == 2 * gb200.host_link_theory_bps
    assert vr200.host_link_bps / vr200.host_link_theory_bps == pytest.approx(
        gb200.host_link_bps / gb200.host_link_theory_bps
    )


@pytest.fixture(scope="module")
def llama_sweep():
    """llama3-8b on 8 H200s (FSDP), 16 × 4096 per device, host link 2 → 420 GB/s: a case where the
    best plan keeps nothing on the host at a slow link and offloads MLP inputs once the link is fast
    (with the prefetching scan's whole-layer window, offloading already pays at 5 GB/s).
    The loss is tiled (16 tiles) as a run at this size would be: untiled, the float32 logits and
    their gradient (2 × 31 GiB) leave so little room that even the slow link's plan must offload."""
    cfg = apply_overrides(get_config("llama3-8b"), ["loss_tiles=16", "attention=blockwise"])
    mesh = {"data": 1, "fsdp": 8, "tensor": 1, "expert": 1}
    rates = cm.target_rates("h200", cfg.dtype)
    solve = whatif.plan_solver(
        cfg, mesh, 4096, 16, rates, schedule="lhs", budget_bytes=None, host_budget_bytes=None
    )
    points = whatif.sweep(
        "host_link", [2.0, 170.0, 420.0], solve=solve, references=whatif.REFERENCES
    )
    return cfg, mesh, rates, points


def test_sweep_points_are_the_planners_own_answers(llama_sweep):
    cfg, mesh, rates, points = llama_sweep
    inv = inv_lib.model_inventory(cfg, 16, 4096, mesh)
    for p in points:
        direct = planner.plan(
            for_inventory(cfg, inv),
            whatif.override_rates(rates, [f"host_link={p.value}"]),
            schedule="lhs",
        )
        assert p.fits and p.tflops_per_device == pytest.approx(direct.predicted.tflops_per_device)
    # A faster link can only help (the plan at a slower link is still available), and here it does.
    tf = [p.tflops_per_device for p in points]
    assert tf[0] < tf[1] <= tf[2]
    offloaded = [sum(v == "offload" for v in p.placements.values()) for p in points]
    assert offloaded[0] == 0 and offloaded[-1] > 0
    assert any("→ offload" in c for p in points for c in p.changed)
    assert points[0].changed == ()  # nothing to compare the first point with
    # remat-full fits everywhere and is slower than the plan once offloading pays.
    assert all(p.reference["remat-full"] is not None for p in points)
    assert points[-1].tflops_per_device > points[-1].reference["remat-full"]


def test_plan_sweep_cli_writes_table_png_and_record(tmp_path, console_script):
    out = tmp_path / "frontier.png"
    r = console_script(
        "plan",
        "--model",
        "llama3-8b",
        "--target",
        "h200",
        "--mesh",
        "fsdp=8",
        "--microbatch",
        "16",
        "--seq",
        "4096",
        "--sweep",
        "host_link=20:420:200",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["schema"] == "tierax.sweep/1" and [p["value"] for p in doc["points"]] == [
        20,
        220,
        420,
    ]
    assert "host_link" in r.stdout and "plan change" in r.stdout
    # tierax report embeds the frontier (picture and table) next to a bench record.
    demo = (
        pathlib.Path(__file__).resolve().parents[1]
        / "bench"
        / "results"
        / "demo-bench-tiny-deepseek.json"
    )
    rep = tmp_path / "report"
    r = console_script(
        "report", str(demo), "--sweep", str(out.with_suffix(".json")), "--out", str(rep)
    )
    assert r.returncode == 0, r.stderr
    summary = (rep / "summary.md").read_text()
    assert (
        "## Frontier: frontier" in summary
        and "![planner frontier](frontier-frontier.png)" in summary
    )
    assert "| 220 | yes |" in summary and (rep / "frontier-frontier.png").stat().st_size > 20_000
    r = console_script("report", str(demo), "--sweep", str(demo), "--out", str(tmp_path / "bad"))
    assert r.returncode == 2 and "tierax.sweep/1" in r.stderr and not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["plan", "--sweep", "host_link=500:100:10"], "no points"),
        (["plan", "--rate", "warp=9"], "unknown key 'warp'"),
        (["simulate", "--target", "a100"], "gb300, vr200"),
        (["compile", "--target", "vr200"], "is a projection"),
    ],
)
def test_what_if_bad_input_exits_2(args, fragment, console_script, cli):
    # plan and simulate (which set no XLA flag) in this process; compile, which sets its flags at
    # start-up, through the command in a new one
    r = (console_script if args[0] == "compile" else cli)(*args)
    assert r.returncode == 2 and fragment in r.stderr, r.stderr


def _main(monkeypatch, *args):
    from tierax import cli

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # JAX started (conftest): nothing to configure
    return cli.main(list(args))


SIX = ["--model", "tiny-llama", "--set", "num_layers=6", "--microbatch", "8", "--seq", "64"]
# A budget where a split of the 6 layers beats every unsplit plan: 21 MiB for the model's own
# buffers beside XLA:GPU's fixed bytes (by jaxlib release; 25 MiB in all when those were 4 MiB).
BUDGET_GIB = (cm.target_rates("h200", "float32").fixed_device_bytes + 21 * 2**20) / 2**30


def test_sweep_with_segments_plans_segments_at_every_point(monkeypatch, capsys):
    assert (
        _main(monkeypatch, "plan", *SIX, "--budget-gib", str(BUDGET_GIB), "--segments", "--json")
        == 0
    )
    single = json.loads(capsys.readouterr().out)
    assert single["plan"]["groups"]["decoder"].get("segments")  # the split wins here
    assert (
        _main(
            monkeypatch,
            "plan",
            *SIX,
            "--segments",
            "--json",
            "--sweep",
            f"budget={BUDGET_GIB}:{BUDGET_GIB}:1",
        )
        == 0
    )
    (point,) = json.loads(capsys.readouterr().out)["points"]
    assert point["step_time_s"] == single["predicted"]["step_time_s"]
    assert any(k.startswith("decoder@") for k in point["placements"])


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--sweep", "budget=1:2:1", "--check"], "one plan per point and --check applies"),
        (
            ["--sweep", "budget=1:2:1", "--emit", "maxtext", "--max-microbatch"],
            "--emit, --max-microbatch apply to a single plan",
        ),
        (["--sweep", "budget=1:2:1", "--for", "maxtext"], "--for applies to a single plan"),
        (
            ["--check-iterations", "2"],
            "--check-iterations bounds the compiles of --check; add --check",
        ),
        (["--emit", "maxtext", "--json"], "both on stdout; give --out FILE"),
        (["--check", "--target", "cpu"], "target 'cpu' is this machine's measured rates"),
        (
            ["--sweep", "nvlink_domain=1:16:0.5"],
            "'nvlink_domain=1:16:0.5': nvlink_domain counts dev",
        ),
    ],
)
def test_plan_refuses_options_it_would_ignore_before_any_work(monkeypatch, capsys, extra, fragment):
    from tierax.tracing import inventory as inv_module
    from tierax.xla import compile as compile_lib

    def no_work(*a, **k):
        raise AssertionError("worked before refusing")

    monkeypatch.setattr(compile_lib, "compile_for_target", no_work)
    monkeypatch.setattr(inv_module, "model_inventory", no_work)
    assert _main(monkeypatch, "plan", "--model", "tiny-llama", *extra) == 2
    assert fragment in capsys.readouterr().err


def test_a_sweep_replaces_its_own_record_but_not_another_file(monkeypatch, capsys, tmp_path):
    out = tmp_path / "sw2.png"
    mine = out.with_suffix(".json")
    mine.write_text('{"results": "of my own"}\n')
    args = [
        "plan",
        "--model",
        "tiny-llama",
        "--microbatch",
        "2",
        "--seq",
        "32",
        "--sweep",
        "budget=1:2:1",
        "--out",
        str(out),
    ]
    assert _main(monkeypatch, *args) == 2
    assert "is not a tierax.sweep/1 record; it is not replaced" in capsys.readouterr().err
    assert mine.read_text() == '{"results": "of my own"}\n' and not out.exists()
    mine.unlink()
    assert _main(monkeypatch, *args) == 0  # writes sw2.png and sw2.json
    assert _main(monkeypatch, *args) == 0  # and may replace the record it wrote
    assert json.loads(mine.read_text())["schema"] == "tierax.sweep/1"


def test_an_impossible_domain_fill_is_refused_on_one_device_as_on_many(monkeypatch, capsys):
    for devices in ("1", "16"):
        assert (
            _main(
                monkeypatch,
                "simulate",
                "--model",
                "tiny-llama",
                "--devices",
                devices,
                "--rate",
                "gpus_per_domain=1000",
            )
            == 2
        ), devices
        assert "gpus_per_domain=1000 is more than the 8 devices" in capsys.readouterr().err
