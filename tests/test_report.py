"""`tierax report`: charts, Markdown summary and the README's performance table from recorded
results."""

import json
import pathlib
import shutil

import pytest

from tierax.errors import TieraxError
from tierax.report import report as R

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "bench" / "results" / "demo-bench-tiny-deepseek.json"
CPU_TRACE = pathlib.Path(__file__).parent / "fixtures" / "cpu_trace"
GPU_TRACE = pathlib.Path(__file__).parent / "fixtures" / "gpu_synthetic_trace.json"
PNG = b"\x89PNG\r\n\x1a\n"


def _png_ok(path: pathlib.Path) -> bool:
    return path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


def test_report_from_the_demo_results(cli, tmp_path):
    out = tmp_path / "report"
    r = cli("report", DEMO, "--out", out, "--trace", CPU_TRACE)
    assert r.returncode == 0
    assert _png_ok(out / "demo-bench-tiny-deepseek-throughput-vs-memory.png")
    assert _png_ok(out / "timeline.png")
    md = (out / "summary.md").read_text()
    plans = [r["plan"] for r in json.loads(DEMO.read_text())["records"]]
    for plan in plans:
        assert f"| {plan} |" in md
    assert "compiled temp" in md and "offloading is a no-op" in md
    assert "(demo-bench-tiny-deepseek-throughput-vs-memory.png)" in md and "(timeline.png)" in md
    assert "no host↔device transfers" in md  # the CPU trace says so instead of inventing transfers
    assert "wrote" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary left behind


def test_report_into_a_directory_holding_files_refuses_and_replaces_nothing(tmp_path, cli):
    """One rule for output directories (as profile --out): new or empty, never another's files."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.md").write_text("my own notes\n")
    r = cli("report", DEMO, "--out", out)
    assert r.returncode == 2
    assert "already exists and is not empty; nothing in it is deleted or replaced" in r.stderr
    assert [p.name for p in out.iterdir()] == ["summary.md"]
    assert (out / "summary.md").read_text() == "my own notes\n"
    with pytest.raises(TieraxError, match="is not empty"):
        R.build_report([DEMO], out)  # the library applies the same rule
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("report", DEMO, "--out", empty).returncode == 0
    assert (empty / "summary.md").is_file()


def test_report_with_a_gpu_trace_shows_transfers(tmp_path):
    R.build_report([DEMO], tmp_path / "r", trace=GPU_TRACE)
    md = (tmp_path / "r" / "summary.md").read_text()
    # step 1 of the synthetic trace: D→H 0.3 ms at 20 GB/s, H→D 0.1 ms at 10 GB/s, exposed 0.1 ms
    assert (
        "| 1 | /device:GPU:0 | 0.900 | 0.500 | 0.300 | 20.0 | 0.100 | 10.0 | 0.300 | 0.100 |" in md
    )


def _readme(tmp_path, body="old table\n") -> pathlib.Path:
    f = tmp_path / "README.md"
    f.write_text(f"# x\n\nbefore\n\n{R.README_START}\n{body}{R.README_END}\n\nafter\n")
    return f


def test_readme_section_is_regenerated_and_nothing_else_changes(tmp_path):
    readme = _readme(tmp_path)
    R.build_report([DEMO], tmp_path / "r", readme=readme)
    text = readme.read_text()
    assert text.startswith(f"# x\n\nbefore\n\n{R.README_START}\n")
    assert text.endswith(f"{R.README_END}\n\nafter\n")
    assert "old table" not in text
    assert "| plan | step ms | tokens/s |" in text and "demo-bench-tiny-deepseek.json" in text
    R.build_report([DEMO], tmp_path / "r2", readme=readme)  # a new directory: "r" is not empty
    assert readme.read_text() == text  # idempotent


def test_the_projects_readme_table_is_the_generated_one(tmp_path):
    """README.md's perf-table section is exactly what `tierax report --readme` writes from the demo
    results."""
    text = (ROOT / "README.md").read_text()
    start = text.index(R.README_START) + len(R.README_START) + 1
    body = text[start : text.index(R.README_END)]
    # Generated from the repository root (the table names the results file relative to it).
    with pytest.MonkeyPatch.context() as m:
        m.chdir(ROOT)
        assert body == R.perf_table(R.load_results("bench/results/demo-bench-tiny-deepseek.json"))


def _gpu_check_doc() -> dict:
    def rec(plan, preset_ms, peak, exposed, verified=None):
        return {
            "plan": plan,
            "step_time_s": preset_ms / 1e3,
            "tokens_per_s": 40960 / (preset_ms / 1e3),
            "tflops_per_device": 500.0,
            "mfu": 0.6,
            "compiled_temp_bytes": peak // 2,
            "peak_device_bytes_compiled": peak,
            "peak_device_bytes_runtime": peak - 2**30,
            "runtime_peak_exact": True,
            "host_bytes_compiled": 3 * 2**30 if "offload" in plan else 0,
            "exposed_transfer_s": exposed,
            "verified": verified,
            "loss": 11.9,
        }

    runs = [
        {
            "xla_preset": p,
            "records": [
                rec("remat-full", 1300 + i, 76 * 2**30, None),
                rec("qkv-offload", 1250 + 30 * i, 77 * 2**30, 0.02 - 0.01 * i, True),
                {
                    "plan": "minimal",
                    "step_time_s": None,
                    "tokens_per_s": None,
                    "skipped": "does not fit",
                },
            ],
        }
        for i, p in enumerate(("none", "lhs", "lhs-pipelined"))
    ]
    return {
        "schema": R.GPU_CHECK_SCHEMA,
        "mode": "gpu",
        "command": "python3 bench/gpu_check.py",
        "created": "2026-11-29T00:00:00Z",
        "jax_version": "0.11.2",
        "machine": {
            "platform": "gpu",
            "device_kind": "NVIDIA H200",
            "device_count": 1,
            "python": "3.12.3",
        },
        "model": {"name": "llama3-8b-8L-bf16"},
        "microbatch_per_device": 10,
        "seq": 4096,
        "steps": 3,
        "link": {"h2d_bytes_per_s": 5.3e10, "d2h_bytes_per_s": 5.1e10},
        "matmul": {"flops_per_s": 7.8e14},
        "planner": {"status": "planner: not available (test)"},
        "runs": runs,
        "notes": [],
    }


def test_report_reads_gpu_check_results(tmp_path):
    f = tmp_path / "gpu-check.json"
    f.write_text(json.dumps(_gpu_check_doc()))
    R.build_report([f], tmp_path / "r")
    assert _png_ok(tmp_path / "r" / "gpu-check-throughput-vs-memory.png")
    md = (tmp_path / "r" / "summary.md").read_text()
    assert "| qkv-offload | lhs-pipelined |" in md and "runtime" in md
    assert "| minimal | none | — |" in md  # did not fit: listed, not plotted
    assert "H→D 53.0 GB/s" in md and "planner: not available" in md


# --- bad input: exit 2, clear message, nothing written ---------------------------------------


@pytest.mark.parametrize(
    "make, fragment",
    [
        (
            lambda d: d.write_text(json.dumps({"schema": "tierax.bench/0", "records": []})),
            "has schema 'tierax.bench/0'; this tierax reads tierax.bench/1",
        ),
        (lambda d: d.write_text("{not json"), "is not JSON"),
        (
            lambda d: d.write_text(
                json.dumps({"schema": "tierax.bench/1", "records": [{"plan": "x"}]})
            ),
            "lacks step_time_s, tokens_per_s",
        ),
    ],
)
def test_bad_results_file_exits_2_and_writes_nothing(cli, tmp_path, make, fragment):
    bad = tmp_path / "bad.json"
    make(bad)
    readme = _readme(tmp_path)
    before = readme.read_text()
    r = cli("report", DEMO, bad, "--out", tmp_path / "r", "--readme", readme)
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r").exists() and readme.read_text() == before


def test_trace_dir_without_trace_exits_2_and_writes_nothing(cli, tmp_path):
    empty = tmp_path / "no-trace"
    empty.mkdir()
    readme = _readme(tmp_path)
    before = readme.read_text()
    r = cli("report", DEMO, "--out", tmp_path / "r", "--trace", empty, "--readme", readme)
    assert r.returncode == 2 and "holds no trace" in r.stderr
    assert not (tmp_path / "r").exists() and readme.read_text() == before


def test_readme_without_markers_exits_2_and_writes_nothing(cli, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    r = cli("report", DEMO, "--out", tmp_path / "r", "--readme", readme)
    assert r.returncode == 2 and "perf-table:start" in r.stderr
    assert not (tmp_path / "r").exists() and readme.read_text() == "# no markers\n"


def test_marker_errors():
    with pytest.raises(TieraxError, match="exactly one"):
        R.replace_marked_section(f"{R.README_END}\n{R.README_START}\n", "t")
    with pytest.raises(TieraxError, match="exactly one"):
        R.replace_marked_section(f"{R.README_START}{R.README_START}{R.README_END}", "t")


def test_missing_results_file_is_a_clear_error(tmp_path):
    with pytest.raises(TieraxError, match="does not exist"):
        R.load_results(tmp_path / "nope.json")
    shutil.copy(DEMO, tmp_path / "ok.json")
    assert R.load_results(tmp_path / "ok.json").kind == "bench"


def test_chart_labels_never_overlap(tmp_path):
    from tierax.report.plots import Point, throughput_vs_memory

    # Coincident and near points (as three XLA presets of one plan give) share one label.
    pts = [
        Point("remat-full", 75e9, 31500, "none"),
        Point("remat-full", 75e9, 31480, "lhs"),
        Point("remat-full", 75e9, 31460, "lhs-pipelined"),
        Point("qkv-offload", 76e9, 32770, "none"),
        Point("qkv-offload", 76e9, 32000, "lhs"),
        Point("qkv-offload", 76e9, 31260, "lhs-pipelined"),
        Point("minimal", 75.1e9, 31400, "none"),
        Point("minimal", 75.05e9, 31700, "lhs"),
    ]
    boxes = throughput_vs_memory(pts, tmp_path / "c.png", title="t", memory_label="m")
    assert 1 < len(boxes) < len(pts)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    assert _png_ok(tmp_path / "c.png")


def test_measuring_verbs_have_help(cli):
    for verb, fragment in (
        ("verify", "bfloat16 2e-2"),
        ("profile", "ui.perfetto.dev"),
        ("report", "perf-table"),
    ):
        r = cli(verb, "--help")
        assert (
            r.returncode == 0
            and f"usage: tierax {verb}" in r.stdout
            and fragment in " ".join(r.stdout.split())
        )
