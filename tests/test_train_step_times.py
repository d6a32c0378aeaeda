"""The step times ``metrics.jsonl`` records (issue 60: a resumed run logged a validation step at
0.226 ms, 1.1 M tokens/s).  The loop reads a step's result after dispatching the next one, and a
validation or checkpoint step is waited for right after its dispatch.  Where the previous step
ended only after that dispatch (the slow first step of a resumed run) or the step ran during it
(a dispatch that runs the step to its end), the waited-for step was timed from after its own batch,
dispatch and (part of) its work: its device time alone, or nothing.  Checked against the step's own
time measured apart: the same compiled step dispatched and waited for, the fastest of several
runs."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import jax
import pytest
import tokenizer_files as TF

from tierax.train import config as TC
from tierax.train import data as D
from tierax.train import loop as L
from tierax.train.run_dir import read_metrics

MB, SEQ = 4, 32


def _config(tmp_path: pathlib.Path, steps: int, checkpoint_every: int):
    return TC.config_from_mapping(
        {
            "model": "tiny-llama",
            "plan": "minimal",
            "microbatch": MB,
            "seq": SEQ,
            "steps": steps,
            "optimizer": {"lr": 0.01, "warmup_steps": 2},
            "checkpoint": {"every": checkpoint_every, "keep": 2, "dir": str(tmp_path / "ckpt")},
            "log": {"dir": str(tmp_path / "run"), "every": 1, "plot": False},
            "data": {
                "source": "tokens",
                "path": str(tmp_path / "tok"),
                "validation_every": 2,
                "validation_batches": 1,
            },
        },
        [],
    )


def _prepare(tmp_path: pathlib.Path) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TF.paragraphs()))
    D.prepare([docs], tmp_path / "tok", validation_fraction=0.2)


def _fastest_step_s(trainer: L.Trainer, k: int, runs: int = 5) -> float:
    """The trainer's compiled step on step ``k``'s batch, dispatched and waited for each time."""
    best = float("inf")
    for _ in range(runs):
        batch = trainer.batch(k)
        t0 = time.perf_counter()
        trainer.state, metrics = trainer._step_fn(trainer.state, *batch)
        jax.block_until_ready(metrics)
        best = min(best, time.perf_counter() - t0)
    return best


def _check(run_dir: pathlib.Path, steps: list[int], validated: list[int], floor: float) -> None:
    """Every record is at least half the step run alone (the machine's load may slow the runs
    apart; a record timed over the step's device time alone, or nothing, is a small fraction)."""
    records = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(records) == steps
    assert [k for k, r in records.items() if r["val_loss"] is not None] == validated
    times = {k: r["step_time_s"] for k, r in records.items()}
    assert all(t >= 0.5 * floor for t in times.values()), (times, floor)
    for r in records.values():
        assert r["tokens_per_s"] == pytest.approx(MB * SEQ / r["step_time_s"])


def test_a_validation_step_is_timed_whole_when_the_dispatch_runs_the_step(tmp_path):
    """Steps 1 to 4 of a 10-step run (the step program of tests/test_train_loop.py's NaN run, a
    compile they share), validation at 2 and 4, each dispatch returning once its step has run: the
    previous step's result is then read after this step's work, and the old loop timed steps 2 and
    4 over nothing."""
    _prepare(tmp_path)
    with L.Trainer(_config(tmp_path, 10, 10), devices=jax.devices()[:1]) as t:
        step = t._step_fn
        t._step_fn = lambda *args: jax.block_until_ready(step(*args))
        t.train(until=4)
        floor = _fastest_step_s(t, 5)
    _check(tmp_path / "run", [1, 2, 3, 4], [2, 4], floor)


def resumed_run_times_every_step_whole(tmp_path: pathlib.Path) -> None:
    """Steps 1, 2 (validation, checkpoint); resumed from 2: 3 (the resumed run's slow first step),
    4 (validation, checkpoint, the last)."""
    _prepare(tmp_path)
    with L.Trainer(_config(tmp_path, 4, 2), devices=jax.devices()[:1]) as first:
        first.train(until=2)
    with L.Trainer(_config(tmp_path, 4, 2), resume=True, devices=jax.devices()[:1]) as resumed:
        assert resumed.train().resumed_from == 2
        floor = _fastest_step_s(resumed, 4)
    _check(tmp_path / "run", [1, 2, 3, 4], [2, 4], floor)


@pytest.mark.slow  # a child process and two trainers (~30 s); the test above: the same timing rule
def test_a_resumed_one_device_cpu_run_times_its_validation_step_whole(tmp_path):
    """As `tierax train` runs on one CPU device (this process has 8 host devices, a faster step
    than its dispatch overhead there is not reached): the resumed run's first step is slow, and the
    old loop timed the validation step after it over its device time alone."""
    here = pathlib.Path(__file__).parent
    script = (
        "import pathlib, sys\n"
        f"sys.path.insert(0, {str(here)!r})\n"
        "from tierax.launch import flags\n"
        "flags.configure(cpu_devices=1)\n"
        "import test_train_step_times as T\n"
        f"T.resumed_run_times_every_step_whole(pathlib.Path({str(tmp_path)!r}))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
