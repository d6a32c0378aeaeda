"""Orbax checkpoints of `tierax train`: content, keep-N, incomplete steps, foreign directories."""

import hashlib
import pathlib
import shutil

import jax
import numpy as np
import pytest
import yaml

from tierax.errors import TieraxError
from tierax.train import checkpoint as C
from tierax.train import config as TC
from tierax.train import loop as L
from tierax.train.run_dir import read_metrics
from tierax.train.schedule import lr_schedule

RUN = {
    "model": "tiny-llama",
    "plan": "minimal",
    "microbatch": 2,
    "seq": 16,
    "steps": 6,
    "seed": 4,
    "optimizer": {"lr": 0.01, "warmup_steps": 2},
    "checkpoint": {"every": 2, "keep": 2},
    "log": {"every": 1, "plot": False},
}


def _config(log_dir, overrides=()):
    return TC.config_from_mapping({**RUN, "log": {**RUN["log"], "dir": str(log_dir)}}, overrides)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 6-step run with checkpoints every 2 steps, keep 2; its final state in host memory."""
    run = tmp_path_factory.mktemp("run")
    with L.Trainer(_config(run), devices=jax.devices()[:1]) as trainer:
        trainer.train()
        final = jax.tree.map(np.asarray, trainer.state)
    return run, final


def _snapshot(root: pathlib.Path) -> dict:
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_checkpoint_holds_state_config_and_data_position(finished, tmp_path):
    run, final = finished
    ckpts = run / "checkpoints"
    assert C.complete_steps(ckpts) == [4, 6]  # keep 2: step 2 was rotated out
    meta = C.read_meta(ckpts, 6)
    assert meta["step"] == 6 and meta["data"] == {"source": "synthetic", "seed": 4, "next_step": 7}
    assert TC.config_from_mapping(meta["config"]).to_dict() == _config(run).to_dict()
    assert meta["identity"]["model"]["d_model"] == 64
    # Restoring into a fresh state gives the run's final parameters, Adam moments and step, bit for
    # bit.
    cfg = _config(run)
    from tierax.train import step as S

    _, like = S.init_state(
        cfg.model, S.make_optimizer(lr_schedule(cfg), grad_clip=cfg.optimizer.grad_clip), seed=0
    )
    ck = C.Checkpointer(ckpts, keep=2)
    state, _ = ck.restore(6, like)
    ck.close()
    assert int(state.step) == 6
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(final), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_incomplete_checkpoints_are_never_resumed_from(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    ckpts = run / "checkpoints"
    # What a save killed mid-write leaves: Orbax's temporary directory, with some of its files.
    tmp = ckpts / "8.orbax-checkpoint-tmp-1700000000"
    shutil.copytree(ckpts / "6", tmp)
    (tmp / "_CHECKPOINT_METADATA").unlink()
    assert C.complete_steps(ckpts) == [4, 6] and C.incomplete_steps(ckpts) == []
    resumed = _config(run, ["steps=8", "optimizer.decay_steps=6"])
    with L.Trainer(resumed, resume=True, devices=jax.devices()[:1]) as trainer:
        assert trainer.resumed_from == 6 and trainer.step == 6
        result = trainer.train()
    assert (result.first_step, result.last_step, result.last_checkpoint) == (7, 8, 8)
    assert C.complete_steps(ckpts) == [6, 8] and not tmp.exists()  # Orbax cleaned its leftover
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 9))

    # A step directory without a commit record is not a checkpoint either; Orbax would still count
    # it against keep-N, so training beside it is refused and nothing is touched.
    bogus = ckpts / "10"
    (bogus / "state").mkdir(parents=True)
    before = _snapshot(run)
    with pytest.raises(TieraxError, match=r"not complete checkpoints \(.*10: no commit record\)"):
        L.Trainer(
            _config(run, ["steps=12", "optimizer.decay_steps=6"]),
            resume=True,
            devices=jax.devices()[:1],
        )
    assert _snapshot(run) == before


def test_a_foreign_checkpoint_directory_is_refused_untouched(finished, tmp_path, console_script):
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    before = _snapshot(run)
    with pytest.raises(
        TieraxError,
        match=r"belongs to a different run; mismatched: model.d_model: 64 \(checkpoint\) "
        r"vs 32 \(this run\); seed: 4 \(checkpoint\) vs 5",
    ):
        L.Trainer(
            _config(run, ["model.d_model=32", "seed=5"]), resume=True, devices=jax.devices()[:1]
        )
    with pytest.raises(TieraxError, match="already holds checkpoints .*pass --resume"):
        L.Trainer(_config(run), devices=jax.devices()[:1])
    with pytest.raises(TieraxError, match="optimizer.decay_steps: 6 .* keep its schedule"):
        L.Trainer(_config(run, ["steps=10"]), resume=True, devices=jax.devices()[:1])
    assert _snapshot(run) == before

    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump({**RUN, "log": {**RUN["log"], "dir": str(run)}}))
    r = console_script("train", str(f), "model=tiny-deepseek", "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert (
        "belongs to a different run" in r.stderr
        and "model.family: 'llama' (checkpoint) vs 'deepseek'" in r.stderr
    )
    assert _snapshot(run) == before
