"""Two `tierax train` processes on localhost (4 CPU devices each, gloo collectives) train on one
8-device mesh and report the losses of a single-process 8-device run; stopped mid-epoch and
resumed, they continue exactly as an uninterrupted pair.

Tolerance: relative 1e-5 on every loss.  The programs are the same SPMD program, but the
cross-process all-reduces go through gloo, whose summation order may differ from the
in-process one, so the results are equal up to float32 rounding, not bit for bit.
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
import tokenizer_files as TF
import yaml

from tierax import launch
from tierax.train import checkpoint as C
from tierax.train import config as TC
from tierax.train import data as D
from tierax.train import loop as L
from tierax.train.run_dir import read_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two(cfg_file: pathlib.Path, *extra: str) -> list[dict]:
    """`tierax train CFG --json EXTRA...` as processes 0 and 1 of one run; their JSON summaries."""
    exe = shutil.which("tierax")
    cmd = [exe] if exe else [sys.executable, "-m", "tierax.cli"]
    cmd += ["train", str(cfg_file), *extra, "--json"]
    port = _free_port()
    # Without the launch variables (each process gets its own); the run's hermetic environment
    # (tests/conftest.py: HOME, TIERAX_CALIBRATION, ...) stays.
    env = {k: v for k, v in os.environ.items() if k not in launch.Distributed.ENV}
    # Process 0 is configured by flags, process 1 by the environment: both ways are supported.
    p0 = subprocess.Popen(
        cmd + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    p1 = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **env,
            "TIERAX_COORDINATOR": f"127.0.0.1:{port}",
            "TIERAX_NUM_PROCESSES": "2",
            "TIERAX_PROCESS_ID": "1",
        },
    )
    outs = []
    try:
        for p in (p0, p1):
            out, err = p.communicate(timeout=480)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in (p0, p1):
            if p.poll() is None:
                p.kill()
    assert [o["process_index"] for o in outs] == [0, 1] and all(
        o["process_count"] == 2 for o in outs
    )
    assert outs[0]["losses"] == outs[1]["losses"]  # one replicated value, read by both processes
    return outs


@pytest.mark.slow  # three training processes
def test_two_processes_match_one_process_and_resume_mid_epoch(tmp_path):
    """Packed documents of a BPE-tokenized corpus small enough for an epoch to end inside step 2,
    with document masking.  Two processes match one; two processes stopped after step 2 (mid-epoch)
    and resumed read the same batches as the uninterrupted two: the losses are bit-identical."""
    tok = TF.hf_bpe(tmp_path / "hf")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TF.paragraphs()[:10]))
    D.prepare([docs], tmp_path / "tokens", tokenizer=str(tok), shard_tokens=300)
    run = {
        "model": "tiny-llama",
        "plan": "minimal",
        "microbatch": 2,
        "seq": 32,
        "steps": 4,
        "mesh": {"data": 2, "fsdp": 4},
        "optimizer": {"lr": 0.01, "warmup_steps": 1, "decay_steps": 4},
        "data": {"source": "tokens", "path": str(tmp_path / "tokens"), "document_mask": True},
        "checkpoint": {"every": 2, "keep": 2},
        "log": {"every": 1, "plot": False},
    }
    vocab = "model.vocab_size=1024"
    # The single-process reference on this process's 8 devices.
    ref_cfg = TC.config_from_mapping(run, [vocab, f"log.dir={tmp_path / 'one'}"])
    with L.Trainer(ref_cfg) as trainer:
        assert jax.device_count() == 8
        windows = trainer.stream.windows[0]
        assert 16 < windows < 32  # the first epoch ends inside step 2 (16 sequences a step)
        reference = trainer.train()
    assert reference.epochs == (4 * 16 / windows,) and reference.tokens_seen == 4 * 16 * 32

    def config(name: str) -> pathlib.Path:
        f = tmp_path / f"{name}.yaml"
        f.write_text(yaml.safe_dump({**run, "log": {**run["log"], "dir": str(tmp_path / name)}}))
        return f

    whole = _run_two(config("two"), vocab)
    np.testing.assert_allclose(whole[0]["losses"], reference.losses, rtol=1e-5)
    # Only process 0 wrote the log; both wrote their shards of the checkpoints.
    assert [r["step"] for r in read_metrics(tmp_path / "two")] == [1, 2, 3, 4]
    assert C.complete_steps(tmp_path / "two" / "checkpoints") == [2, 4]

    first = _run_two(config("three"), vocab, "steps=2")
    resumed = _run_two(config("three"), vocab, "--resume")
    assert first[0]["last_step"] == 2 and resumed[0]["resumed_from"] == 2
    assert first[0]["losses"] + resumed[0]["losses"] == whole[0]["losses"]  # bit for bit
    assert [r["loss"] for r in read_metrics(tmp_path / "three")] == whole[0]["losses"]
