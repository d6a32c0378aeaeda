"""`tierax train`: config validation, the loop, kill-and-resume, divergence, the demo's learning."""

import json
import math
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest
import tokenizer_files as TF
import yaml

from tierax import launch
from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.measure import gate
from tierax.models import get_config
from tierax.report.metrics_plot import plot_metrics
from tierax.train import checkpoint as C
from tierax.train import config as TC
from tierax.train import data as D
from tierax.train import loop as L
from tierax.train import step as S
from tierax.train.run_dir import CONFIG_SNAPSHOT, read_metrics

ROOT = pathlib.Path(__file__).parent.parent
SAMPLE = ROOT / "data" / "sample.txt"


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    D.prepare_text(SAMPLE, out)
    return out


def small(**over) -> dict:
    """A CPU-sized run on one device: tiny-llama, 20 steps, checkpoints every 10."""
    cfg = {
        "model": "tiny-llama",
        "plan": "minimal",
        "microbatch": 4,
        "seq": 32,
        "steps": 20,
        "optimizer": {"lr": 0.01, "warmup_steps": 2},
        "checkpoint": {"every": 10, "keep": 3},
        "log": {"dir": "runs/x", "every": 5, "plot": False},
    }
    for key, value in over.items():
        head, _, tail = key.partition("__")
        if tail:
            cfg.setdefault(head, {})[tail] = value
        else:
            cfg[head] = value
    return cfg


# --- configs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, overrides, fragment",
    [
        (
            {"model": "tiny-llama", "stesp": 3},
            [],
            "unknown key 'stesp' (did you mean 'steps'?); valid keys: model, plan",
        ),
        (
            {"model": "tiny-llama", "mesh": {"fsdpp": 2}},
            [],
            "unknown key 'mesh.fsdpp' (did you mean 'mesh.fsdp'?)",
        ),
        (
            {"model": "tiny-llama"},
            ["optimizer.learning_rate=1"],
            "valid keys in optimizer: optimizer.lr",
        ),
        ({"model": "tiny-llama", "steps": "ten"}, [], "steps expects int"),
        ({"model": "tiny-llama", "optimizer": {"lr": "fast"}}, [], "optimizer.lr expects float"),
        (
            {"model": "tiny-llama", "mesh": {"fsdp": 4}, "global_batch": 6},
            [],
            "global_batch 6 is not divisible by data×fsdp×expert = 4",
        ),
        (
            {"model": "tiny-llama", "microbatch": 2, "global_batch": 16, "mesh": {"fsdp": 4}},
            [],
            "≠ global_batch 16",
        ),
        ({"model": "tiny-llama", "grad_accum": 0}, [], "grad_accum must be ≥ 1"),
        (
            {"model": "tiny-llama", "mesh": {"tensor": 3}},
            [],
            "num_heads=4 is not divisible by tensor=3",
        ),
        ({"model": "tiny-llama", "data": {"source": "tokens"}}, [], "data.path is not set"),
        ({"model": "tiny-llama", "data": {"source": "web"}}, [], "use one of: synthetic, tokens"),
        (
            {"model": "tiny-llama", "steps": 5},
            [],
            "warmup_steps=10 must be below the decay horizon",
        ),
        ({"model": "tiny-lama"}, [], "unknown model 'tiny-lama'; choose one of: tiny-llama"),
        ({"model": "tiny-llama", "plan": "save-al"}, [], "neither a preset (save-all"),
        (
            {"model": "tiny-llama", "compute_dtype": "fp8"},
            [],
            "use one of: model, float32, bfloat16",
        ),
        (
            {"model": "tiny-llama", "xla_preset": "fast"},
            [],
            "choose one of: none, lhs, lhs-pipelined",
        ),
        (
            {"model": "tiny-llama", "plan": "qkv-offload", "xla_preset": "lhs-pipelined"},
            [],
            "not offered with the 'lhs-pipelined' preset",
        ),
        ({"model": "tiny-llama", "debug": {"nan_at_step": 500}}, [], "after the last step 100"),
        ({"model": "tiny-llama"}, ["steps"], "expected KEY=VALUE"),
        ({"model": "tiny-llama"}, ["model.d_modle=8"], "did you mean 'd_model'"),
        ({"plan": "minimal"}, [], "'model' is required"),
        ({"model": "tiny-llama", "runtime": {"device_budget_gb": 80}}, [], "needs runtime.target"),
    ],
)
def test_config_errors_name_the_problem_and_the_choices(data, overrides, fragment):
    with pytest.raises(TieraxError) as e:
        TC.config_from_mapping(data, overrides, source="cfg.yaml")
    assert fragment in str(e.value)


def test_mesh_must_match_the_devices():
    cfg = TC.config_from_mapping({"model": "tiny-llama", "mesh": {"fsdp": 4}, "cpu_devices": 2})
    with pytest.raises(
        TieraxError,
        match=r"mesh data=1,fsdp=4,tensor=1,expert=1 = 4 devices, but cpu_devices=2 × 1 process",
    ):
        launch.cpu_devices_per_process(cfg)
    with pytest.raises(TieraxError, match="does not split over 3 processes"):
        launch.cpu_devices_per_process(
            TC.config_from_mapping({"model": "tiny-llama", "mesh": {"fsdp": 4}}), 3
        )
    assert (
        launch.cpu_devices_per_process(
            TC.config_from_mapping({"model": "tiny-llama", "mesh": {"fsdp": 8}}), 2
        )
        == 4
    )
    with pytest.raises(
        TieraxError, match="8 are available"
    ):  # the runtime check, against the real devices
        L.Trainer(
            TC.config_from_mapping(
                {"model": "tiny-llama", "mesh": {"fsdp": 2}, "log": {"dir": "unused"}}
            )
        )


def test_overrides_round_trip_and_the_shipped_config_loads(tmp_path):
    cfg = TC.load_train_config(
        ROOT / "configs" / "demo-train.yaml",
        ["mesh.fsdp=4", "optimizer.lr=3e-4", "model.d_model=128", "compute_dtype=bfloat16"],
    )
    assert cfg.mesh.fsdp == 4 and cfg.global_batch == 32 and cfg.optimizer.lr == 3e-4
    assert (
        cfg.model.d_model == 128
        and cfg.model.dtype == "bfloat16"
        and cfg.model.param_dtype == "float32"
    )
    f = tmp_path / "again.yaml"
    f.write_text(TC.config_to_yaml(cfg))
    again = TC.load_train_config(f)
    assert again.to_dict() == cfg.to_dict() and again.plan == cfg.plan
    gb = TC.config_from_mapping(
        {"model": "tiny-llama", "global_batch": 16, "mesh": {"data": 2, "fsdp": 4}}
    )
    assert gb.microbatch == 2 and gb.global_batch == 16


def test_distributed_from_flags_or_environment():
    assert launch.Distributed.resolve(None, None, None, environ={}) is None
    d = launch.Distributed.resolve(
        None,
        None,
        None,
        environ={
            "TIERAX_COORDINATOR": "h:1",
            "TIERAX_NUM_PROCESSES": "2",
            "TIERAX_PROCESS_ID": "1",
        },
    )
    assert d == launch.Distributed("h:1", 2, 1)
    assert (
        launch.Distributed.resolve("a:2", 4, 3, environ={"TIERAX_COORDINATOR": "h:1"}).coordinator
        == "a:2"
    )
    with pytest.raises(TieraxError, match="missing: --process-id"):
        launch.Distributed.resolve("h:1", 2, None, environ={})
    with pytest.raises(TieraxError, match="must be in 0..1"):
        launch.Distributed.resolve("h:1", 2, 2, environ={})
    with pytest.raises(TieraxError, match="expected HOST:PORT"):
        launch.Distributed.resolve("host", 2, 0, environ={})


def test_runtime_env_derives_gpu_settings_from_the_plan():
    env, lines = launch.runtime_env(TC.config_from_mapping({"model": "tiny-llama"}), gpu=False)
    assert env == {} and "nothing set off a GPU" in lines[0]
    cfg = TC.config_from_mapping(
        {
            "model": "tiny-llama",
            "plan": "qkv-offload",
            "mesh": {"fsdp": 8},
            "runtime": {"target": "h200", "device_budget_gb": 120},
        }
    )
    env, lines = launch.runtime_env(cfg, gpu=True, num_processes=1, environ={})
    assert env[launch.MEM_FRACTION] == f"{120e9 / 151397597184:.2f}"
    assert int(env[launch.HOST_LIMIT]) >= 1 and any("offloads" in ln for ln in lines)
    env, lines = launch.runtime_env(cfg, gpu=True, environ={launch.MEM_FRACTION: "0.5"})
    assert launch.MEM_FRACTION not in env and any(
        "kept XLA_PYTHON_CLIENT_MEM_FRACTION=0.5" in ln for ln in lines
    )
    env, _ = launch.runtime_env(
        TC.config_from_mapping({"model": "tiny-llama", "plan": "minimal"}), gpu=True, environ={}
    )
    assert env == {}  # no budget given, nothing offloaded: nothing to set


# --- the step -----------------------------------------------------------------------


def test_gradient_accumulation_equals_one_big_batch():
    import optax

    cfg = get_config("tiny-llama")
    opt = optax.sgd(1.0)  # new params = params − gradient: compares the gradients themselves
    plan = plan_lib.preset("minimal", cfg)
    tokens = S.synthetic_batch(cfg, 4, 16, seed=5)
    graphdef, big = S.init_state(cfg, opt)
    acc = jax.tree.map(jax.numpy.copy, big)  # the step donates its state
    big, m_big = S.make_train_step(graphdef, cfg, plan, opt)(big, tokens)
    acc, m_acc = S.make_train_step(graphdef, cfg, plan, opt, grad_accum=2)(
        acc, tokens.reshape(2, 2, 17)
    )
    np.testing.assert_allclose(float(m_acc["loss"]), float(m_big["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m_acc["grad_norm"]), float(m_big["grad_norm"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(big.params), strict=False):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


# --- runs -----------------------------------------------------------------------------


@pytest.mark.slow  # the demo's training run (make demo runs it too)
def test_demo_config_loss_falls_on_the_shipped_text(token_dir, tmp_path):
    """The demo's 60 steps take the byte-level loss from ≈ ln 256 = 5.5 to below 3.0 (measured ≈
    2.4)."""
    cfg = TC.load_train_config(
        ROOT / "configs" / "demo-train.yaml",
        [f"data.path={token_dir}", f"log.dir={tmp_path}", "checkpoint.every=0"],
    )
    with L.Trainer(cfg, devices=jax.devices()[: cfg.mesh.size]) as trainer:
        result = trainer.train()
    losses = result.losses
    assert len(losses) == cfg.steps == 60
    assert losses[0] > 5.0
    assert np.mean(losses[-10:]) < losses[0] - 2.5 and np.mean(losses[-10:]) < 3.0, losses
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 61))
    assert all(
        r["tokens_per_s"] > 0 and r["tflops_per_device"] > 0 and r["lr"] > 0 for r in records
    )
    assert plot_metrics(tmp_path).stat().st_size > 10_000  # the run's metrics plot
    assert TC.load_train_config(tmp_path / CONFIG_SNAPSHOT).to_dict() == cfg.to_dict()


@pytest.mark.slow  # a training run
def test_validation_tokens_and_epochs_are_logged_and_other_data_is_refused(tmp_path):
    """BPE data with a validation split and document masking: metrics.jsonl has the validation loss
    at validation steps (equal to the loss of the validation windows computed here), tokens seen and
    epochs; resuming the run on other data is refused."""
    tok = TF.hf_bpe(tmp_path / "hf")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TF.paragraphs()))
    D.prepare([docs], tmp_path / "tok", tokenizer=str(tok), validation_fraction=0.1)
    data = {
        "source": "tokens",
        "path": str(tmp_path / "tok"),
        "document_mask": True,
        "validation_every": 3,
        "validation_batches": 2,
    }
    cfg = TC.config_from_mapping(
        small(steps=6, data=data, checkpoint__every=3, log__dir=str(tmp_path / "run")),
        ["model.vocab_size=1024"],
    )
    with L.Trainer(cfg, devices=jax.devices()[:1]) as trainer:
        result = trainer.train()
        windows, params = trainer.stream.windows[0], trainer.state.params
    records = read_metrics(tmp_path / "run")
    val = {r["step"]: r["val_loss"] for r in records if r["val_loss"] is not None}
    assert list(val) == [3, 6] and result.validation == tuple(val.items())
    assert [r["tokens_seen"] for r in records] == [k * 4 * 32 for k in range(1, 7)]
    assert records[-1]["epoch"] == pytest.approx(6 * 4 / windows) and result.epochs == (
        6 * 4 / windows,
    )
    # The validation loss: the first 2 × 4 validation windows, masked by document, with the final
    # parameters.
    corpus = D.open_corpus(tmp_path / "tok", split="validation")
    tokens = np.stack([corpus.read(w * 32, 33) for w in range(8)])
    segs = np.stack([corpus.segments(w * 32, 33) for w in range(8)])
    graphdef, _ = S.init_params(cfg.model)
    loss_fn = jax.jit(S.make_loss_fn(graphdef, plan_lib.to_policies(cfg.plan, cfg.model)))
    mine = np.mean([float(loss_fn(params, tokens[i : i + 4], segs[i : i + 4])) for i in (0, 4)])
    assert val[6] == pytest.approx(mine, rel=1e-5)
    D.prepare([docs], tmp_path / "other", tokenizer=str(tok), validation_fraction=0.2)
    other = TC.config_from_mapping(
        small(
            steps=8,
            data={**data, "path": str(tmp_path / "other")},
            checkpoint__every=3,
            log__dir=str(tmp_path / "run"),
        ),
        ["model.vocab_size=1024"],
    )
    with pytest.raises(TieraxError, match="data"):
        L.Trainer(other, resume=True, devices=jax.devices()[:1])


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = TC.config_from_mapping(
        small(
            steps=10,
            checkpoint__every=2,
            checkpoint__keep=5,
            debug__nan_at_step=6,
            log__dir=str(tmp_path),
        )
    )
    trainer = L.Trainer(cfg, devices=jax.devices()[:1])
    with pytest.raises(
        L.NonFiniteLoss, match=r"step 6: loss is nan .* last good checkpoint is step 4"
    ) as e:
        trainer.train()
    trainer.close()
    assert e.value.step == 6 and e.value.last_checkpoint == 4
    assert C.complete_steps(tmp_path / "checkpoints") == [
        2,
        4,
    ]  # the diverged state was never saved
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["loss"]) for r in read_metrics(tmp_path))


def test_verify_before_training_passes_and_refuses_a_wrong_gradient(monkeypatch):
    # The check itself is tierax.measure.verify's (tested there); this is the gate in front of
    # training.
    from tierax.measure import verify as V

    cfg = TC.config_from_mapping(
        {"model": "tiny-llama", "plan": "minimal", "microbatch": 2, "seq": 16, "seed": 3}
    )
    calls = []

    def fake(passed):
        def verify_plan(model, plan, *, microbatch, seq, seed=0):
            calls.append((model.name, plan.name, microbatch, seq, seed))
            # The fields the trainer relies on (verify_plan's contract).
            return types.SimpleNamespace(
                plan=plan.name,
                max_rel_err=3e-7 if passed else 0.2,
                worst_leaves=("head/kernel: 2.00e-01",),
                tolerance=1e-5,
                passed=passed,
            )

        return verify_plan

    monkeypatch.setattr(V, "verify_plan", fake(True))
    assert "max relative gradient error 3.00e-07 ≤ 1e-05, passed" in gate.verify_before_training(
        cfg
    )
    assert calls == [("tiny-llama", "minimal", 2, 16, 3)]
    monkeypatch.setattr(V, "verify_plan", fake(False))
    with pytest.raises(TieraxError, match="plan 'minimal' changes the gradients of tiny-llama"):
        gate.verify_before_training(cfg)


def _losses(run_dir) -> dict[int, float]:
    out = {}
    for r in read_metrics(run_dir):
        assert r["step"] not in out, f"step {r['step']} logged twice"
        out[r["step"]] = r["loss"]
    return out


@pytest.mark.slow  # training subprocesses killed and resumed
def test_kill_after_a_checkpoint_then_resume_is_bitwise_identical(
    tmp_path, token_dir, console_script
):
    """SIGKILL a `tierax train` process after its step-10 checkpoint is committed; `--resume`
    continues to step 20 with the same losses, bit for bit (CPU), as an uninterrupted run."""
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(small(data={"source": "tokens", "path": str(token_dir)})))
    # The uninterrupted run in this process (same single-device program as the CLI's).
    with L.Trainer(
        TC.load_train_config(f, [f"log.dir={tmp_path / 'whole'}"]), devices=jax.devices()[:1]
    ) as t:
        t.train()

    cut = tmp_path / "cut"
    exe = shutil.which("tierax")
    cmd = [exe] if exe else [sys.executable, "-m", "tierax.cli"]
    proc = subprocess.Popen(
        cmd + ["train", str(f), f"log.dir={cut}", "debug.step_delay_s=0.3"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    try:
        while 10 not in C.complete_steps(cut / "checkpoints"):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no step-10 checkpoint within 300 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert C.complete_steps(cut / "checkpoints") == [10]  # killed before step 20

    resumed = console_script("train", str(f), f"log.dir={cut}", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "checkpoint step 10" in resumed.stdout
    a, b = _losses(tmp_path / "whole"), _losses(cut)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert [b[k] for k in range(11, 21)] == [
        a[k] for k in range(11, 21)
    ]  # bitwise: exact float equality
    assert C.complete_steps(cut / "checkpoints") == [10, 20]


@pytest.mark.slow  # training runs through the CLI
def test_cli_bad_input_exits_2_without_writing_and_divergence_exits_1(tmp_path, console_script):
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(small(log__dir=str(tmp_path / "out"))))
    cases = [
        (["stesp=3"], "unknown key 'stesp'"),
        (
            ["data.source=tokens", f"data.path={tmp_path / 'missing'}"],
            "does not exist; prepare one with",
        ),
        (["cpu_devices=2"], "mesh data=1,fsdp=1,tensor=1,expert=1 = 1 devices, but cpu_devices=2"),
    ]
    for overrides, fragment in cases:
        r = console_script("train", str(f), *overrides)
        assert r.returncode == 2, (overrides, r.stderr)
        assert fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = console_script("train", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    assert not (tmp_path / "out").exists()
    # Divergence is not bad input: exit 1, the step named, no traceback.
    r = console_script("train", str(f), "debug.nan_at_step=3", "checkpoint.every=2")
    assert r.returncode == 1, r.stderr
    assert "step 3: loss is nan" in r.stderr and "last good checkpoint is step 2" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_finished_run_resumed_refuses_before_compiling_and_ctrl_c_again_names_its_checkpoint(
    tmp_path, monkeypatch, capsys
):
    """Resuming a run already at `steps` says so before any compile; a Ctrl-C that stops the run
    at once (the second one, or one before the loop) names the last complete checkpoint and
    --resume."""
    from tierax import cli

    f = tmp_path / "run.yaml"
    f.write_text(
        yaml.safe_dump(
            small(
                steps=2,
                optimizer__warmup_steps=1,
                checkpoint__every=2,
                log__dir=str(tmp_path / "run"),
            )
        )
    )
    with L.Trainer(TC.load_train_config(f), devices=jax.devices()[:1]) as t:
        t.train()
    assert C.complete_steps(tmp_path / "run" / "checkpoints") == [2]

    def no_compile(*a, **k):
        raise AssertionError("compiled a step for a run with nothing to train")

    monkeypatch.setattr(S, "make_train_step", no_compile)
    with pytest.raises(
        TieraxError,
        match=r"is at step 2 and steps is 2: nothing to train\. To "
        r"continue the run, raise steps \(e\.g\. steps=4 optimizer\.decay_steps=2",
    ):
        L.Trainer(TC.load_train_config(f), resume=True, devices=jax.devices()[:1])

    class CtrlCAgain:  # what the second SIGINT does: KeyboardInterrupt out of the loop
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def train(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(launch, "start_training", lambda *a, **k: [])
    monkeypatch.setattr(launch, "check_local_memory", lambda *a, **k: None)
    monkeypatch.setattr(L, "Trainer", CtrlCAgain)
    assert cli.main(["train", str(f), "steps=4", "optimizer.decay_steps=2", "--resume"]) == 130
    err = capsys.readouterr().err
    assert "the last complete checkpoint is step 2 in" in err, err
    assert "continue with --resume" in err, err
