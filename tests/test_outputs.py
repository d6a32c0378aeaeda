"""Outputs are safe: checked before any work, never replacing what the user did not offer, honouring
the
umask; bad input is one line and exit 2; Ctrl-C and a damaged checkpoint say how to go on."""

import json
import os
import pathlib
import signal
import stat
import subprocess
import sys
import time

import pytest
import yaml

from tierax.errors import TieraxError
from tierax.fileio import check_output_dir, check_output_file, write_text_atomic
from tierax.train import checkpoint as C

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --- the library ------------------------------------------------------------------------


def test_atomic_write_honours_the_umask_and_keeps_a_replaced_files_mode(tmp_path):
    old = os.umask(0o027)
    try:
        f = write_text_atomic(tmp_path / "a.json", "{}\n")
        assert stat.S_IMODE(f.stat().st_mode) == 0o640  # not mkstemp's 0600
    finally:
        os.umask(old)
    g = tmp_path / "b.txt"
    g.write_text("old")
    g.chmod(0o604)
    write_text_atomic(g, "new")
    assert g.read_text() == "new" and stat.S_IMODE(g.stat().st_mode) == 0o604
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_token_files_and_metrics_plots_honour_the_umask(tmp_path):
    from tierax.report.metrics_plot import plot_metrics
    from tierax.train import data

    text = tmp_path / "t.txt"
    text.write_text("some text to tokenize\n")
    run = tmp_path / "run"
    run.mkdir()
    rec = {
        "loss": 2.0,
        "grad_norm": 1.0,
        "lr": 1e-3,
        "step_time_s": 0.1,
        "tokens_per_s": 10.0,
        "tflops_per_device": 0.1,
        "time": 0.0,
    }
    lines = [json.dumps({"step": k, **rec}) + "\n" for k in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(lines))
    old = os.umask(0o022)
    try:
        data.prepare_text(text, tmp_path / "tok")
        written = [
            *sorted((tmp_path / "tok").iterdir()),
            plot_metrics(run),
            plot_metrics(run, tmp_path / "elsewhere.png"),
        ]
        assert any(p.name == data.shard_name("train", 0) for p in written)
    finally:
        os.umask(old)
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {
        p.name: "0o644" for p in written
    }  # as open() gives; not mkstemp's 0600


def test_a_read_only_file_is_not_replaced(tmp_path):
    f = tmp_path / "ro.json"
    f.write_text("mine")
    f.chmod(0o444)
    with pytest.raises(TieraxError, match="read-only"):
        write_text_atomic(f, "theirs")
    with pytest.raises(TieraxError, match="exists and is read-only; it is not replaced"):
        check_output_file(f)
    assert f.read_text() == "mine"


def test_output_checks_refuse_before_any_work(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(TieraxError, match="is a directory"):
        check_output_file(tmp_path)
    with pytest.raises(TieraxError, match="is not a directory"):
        check_output_file(tmp_path / "file" / "out.json")
    with pytest.raises(TieraxError, match="is a file; give a directory"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(TieraxError, match="not empty; nothing in it is deleted"):
        check_output_dir(tmp_path, allow_existing=False)
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing


# --- the command line: every case of the list -------------------------------------------

BAD = [
    (["bench", "--out", "/proc/x/b.json"], "cannot create files under '/proc"),
    (["plan", "--out", "/proc/x/p.yaml"], "cannot create files under '/proc"),
    (["compile", "--microbatch", "0"], "--microbatch: must be ≥ 1, got 0"),
    (["compile", "--microbatch", "-1"], "--microbatch: must be ≥ 1, got -1"),
    (["bench", "--microbatch", "0"], "--microbatch: must be ≥ 1, got 0"),
    (["bench", "--devices", "0"], "--devices: must be ≥ 1, got 0"),
    (
        ["inventory", "--target", "a100"],
        "unknown target 'a100'; choose one of: h100, h200, b200, gb200",
    ),
    (["plan", "--budget-gib", "nan"], "--budget-gib: must be a finite number > 0, got 'nan'"),
    (["verify", "--set", "vocab_size=1000000000000"], "more than this machine's RAM"),
]


@pytest.mark.parametrize("args, fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(args, fragment, console_script):
    r = console_script(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert fragment in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_non_utf8_plan_file_and_report_inputs(tmp_path, console_script):
    plan = tmp_path / "plan.yaml"
    plan.write_bytes(b"plan: \xff\xfe\n")
    r = console_script("simulate", "--plan", str(plan))
    assert r.returncode == 2 and "is not UTF-8 text" in r.stderr and "Traceback" not in r.stderr
    existing = tmp_path / "exists.txt"
    existing.write_text("keep")
    rec = tmp_path / "bare.json"
    rec.write_text(json.dumps({"schema": "tierax.bench/1"}))
    r = console_script("report", str(rec), "--out", str(tmp_path / "rep"))
    assert r.returncode == 2 and "holds no per-plan records" in r.stderr
    r = console_script(
        "report",
        str(ROOT / "bench" / "results" / "demo-bench-tiny-deepseek.json"),
        "--out",
        str(existing),
    )
    assert (
        r.returncode == 2
        and "is a file; give a directory" in r.stderr
        and existing.read_text() == "keep"
    )
    nan = json.loads((ROOT / "bench" / "results" / "demo-bench-tiny-deepseek.json").read_text())
    nan["records"][0]["step_time_s"] = float("nan")
    rec.write_text(json.dumps(nan))
    r = console_script("report", str(rec), "--out", str(tmp_path / "rep"))
    assert (
        r.returncode == 2
        and "not a positive number" in r.stderr
        and not (tmp_path / "rep").exists()
    )


def test_a_closed_pipe_ends_quietly():
    exe = [sys.executable, "-m", "tierax.cli"]
    p = subprocess.Popen(
        exe + ["inventory", "--model", "tiny-deepseek", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    p.stdout.read(10)
    p.stdout.close()  # like `| head -c 10`
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def _train_config(tmp_path, **extra) -> pathlib.Path:
    f = tmp_path / "run.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "model": "tiny-llama",
                "plan": "minimal",
                "microbatch": 2,
                "seq": 16,
                "steps": 40,
                "optimizer": {"lr": 0.01, "warmup_steps": 2},
                "log": {"every": 1, "plot": False},
                "checkpoint": {"every": 100, "keep": 3},
                **extra,
            }
        )
    )
    return f


def test_train_output_dirs_are_checked_before_training(tmp_path, console_script):
    f = _train_config(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    t0 = time.monotonic()
    r = console_script("train", str(f), f"log.dir={tmp_path / 'run'}", f"checkpoint.dir={blocker}")
    assert r.returncode == 2 and "checkpoint.dir" in r.stderr and "is a file" in r.stderr
    r = console_script("train", str(f), "log.dir=/proc/x")
    assert r.returncode == 2 and "log.dir '/proc/x'" in r.stderr
    assert time.monotonic() - t0 < 60 and not (tmp_path / "run").exists()


@pytest.mark.slow  # a training subprocess interrupted and resumed
def test_ctrl_c_stops_at_a_step_boundary_checkpoints_and_says_how_to_resume(
    tmp_path, console_script
):
    f = _train_config(tmp_path)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierax.cli",
            "train",
            str(f),
            f"log.dir={run}",
            "debug.step_delay_s=0.2",
            "log.plot=true",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    metrics = run / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert (run / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the steps run so far
    steps = C.complete_steps(run / "checkpoints")
    assert (
        len(steps) == 1 and 3 <= steps[0] < 40
    )  # checkpoint.every is 100: this one is the interrupt's
    assert (
        f"stopped after step {steps[0]}; last checkpoint step {steps[0]}" in err
        and "--resume" in err
    )
    resumed = console_script("train", str(f), f"log.dir={run}", "--resume")
    assert resumed.returncode == 0 and f"checkpoint step {steps[0]}" in resumed.stdout, (
        resumed.stderr
    )


@pytest.mark.slow  # two training subprocesses
def test_a_damaged_newest_checkpoint_names_the_previous_good_one(tmp_path, console_script):
    f = _train_config(tmp_path, steps=4, checkpoint={"every": 2, "keep": 3})
    run = tmp_path / "run"
    assert console_script("train", str(f), f"log.dir={run}").returncode == 0
    ckpts = run / "checkpoints"
    assert C.complete_steps(ckpts) == [2, 4]
    for p in (ckpts / "4" / "state").rglob("*"):
        if p.is_file() and p.stat().st_size > 0 and "metadata" not in p.name:
            p.write_bytes(b"\0" * 7)  # truncated array data
    r = console_script(
        "train", str(f), f"log.dir={run}", "steps=6", "optimizer.decay_steps=4", "--resume"
    )
    assert r.returncode == 2, r.stderr
    assert (
        "reading checkpoint step 4 failed" in r.stderr
        and "the last good checkpoint is step 2" in r.stderr
    )
    assert "Traceback" not in r.stderr


def _mount_tmpfs(where: pathlib.Path, size: str) -> bool:
    where.mkdir()
    try:
        return (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def test_a_full_disk_during_checkpointing_names_the_last_good_checkpoint(tmp_path, console_script):
    """A 3 MB filesystem holds one tiny-llama checkpoint (≈2 MB) but not two: the save that fails is
    reported in a few lines, naming the last complete checkpoint (not Orbax's hundreds of traceback
    lines)."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "3M"):
        pytest.skip(
            "cannot mount a small tmpfs here (needs root and mount permission) to fill a disk"
        )
    try:
        f = _train_config(tmp_path, steps=8, checkpoint={"every": 2, "keep": 5})
        r = console_script(
            "train", str(f), f"log.dir={tmp_path / 'run'}", f"checkpoint.dir={disk / 'ck'}"
        )
        assert r.returncode == 2, r.stderr
        assert "failed" in r.stderr and "the last good checkpoint is step 2" in r.stderr, r.stderr
        # Orbax's per-thread ERROR tracebacks (≈540 lines here before) are filtered. The abandoned
        # save's "Event loop is closed" errors are filtered where they reach sys.excepthook, but
        # under load some are printed during interpreter shutdown, past any hook: not asserted (see
        # the issue note).
        assert "ERROR:absl" not in r.stderr, r.stderr
        # Reported once.  Counted in the whole text: the shutdown tracebacks of Orbax's threads can
        # interleave with the line (a traceback's indent printed before it, its text after).
        assert r.stderr.count("tierax train: error: writing checkpoint") == 1, r.stderr
        assert C.complete_steps(disk / "ck") == [2]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)
