"""``tierax train`` with a plan whose moments live in host memory: the run's checkpoints save and
restore the host-resident moments (Orbax), resuming reproduces the uninterrupted run bit for bit,
and what the step does not run is refused before the run directory exists."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tierax import plan as P
from tierax.errors import TieraxError
from tierax.train import config as TC
from tierax.train import loop as L

RUN = {
    "model": "tiny-llama",
    "plan": {
        "plan": "moments-host",
        "groups": {"decoder": {"default": "remat", "decoder_layer_input": "device"}},
        "state": {"decoder": {"moments": "offload"}},
    },
    "microbatch": 2,
    "seq": 16,
    "steps": 4,
    "seed": 4,
    "optimizer": {"lr": 0.01, "warmup_steps": 2, "grad_clip": None},
    "checkpoint": {"every": 2, "keep": 2},
    "log": {"every": 1, "plot": False},
}


def _config(log_dir, overrides=(), **edits):
    raw = {**RUN, **edits, "log": {**RUN["log"], "dir": str(log_dir)}}
    return TC.config_from_mapping(raw, overrides)


def _host_kinds(state) -> set:
    return {
        x.sharding.memory_kind
        for path, x in jax.tree_util.tree_leaves_with_path(state.opt_state)
        if P.layer_group_of(path) == "decoder"
    }


@pytest.mark.slow  # three trainers, each compiling its step: ~100 s on this shared machine
@pytest.mark.parametrize("clip", [None, 0.05])  # 0.05: the two-pass clipped update, clipping
def test_resume_with_host_moments_is_exact(tmp_path, clip):
    opt = {"optimizer": {**RUN["optimizer"], "grad_clip": clip}}
    whole = tmp_path / "whole"
    with L.Trainer(_config(whole, **opt), devices=jax.devices()[:1]) as trainer:
        trainer.train()
        assert _host_kinds(trainer.state) == {"pinned_host"}
        final = jax.tree.map(np.asarray, trainer.state)
    # Stop after 2 steps (a checkpoint), resume to 4.
    part = tmp_path / "part"
    with L.Trainer(
        _config(part, ["steps=2", "optimizer.decay_steps=4"], **opt), devices=jax.devices()[:1]
    ) as t:
        t.train()
    with L.Trainer(
        _config(part, ["steps=4", "optimizer.decay_steps=4"], **opt),
        resume=True,
        devices=jax.devices()[:1],
    ) as trainer:
        assert trainer.resumed_from == 2
        assert _host_kinds(trainer.state) == {"pinned_host"}  # restored into host memory
        trainer.train()
        resumed = jax.tree.map(np.asarray, trainer.state)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # three trainers, each compiling its step: ~100 s on this shared machine
def test_resume_with_host_masters_is_exact(tmp_path):
    """bfloat16 compute with the decoder's float32 masters and moments in host memory: the
    checkpoint saves the masters (not their compute copies), the restore puts them back in host
    memory and casts the copies again, and the resumed run ends bit-identical — masters, moments
    and copies — to the uninterrupted one."""
    state = {"decoder": {"moments": "offload", "master_weights": "offload"}}
    plan = {**RUN["plan"], "state": state}
    edits = {"plan": plan, "compute_dtype": "bfloat16"}

    def kernels(state) -> set:
        return {
            x.sharding.memory_kind
            for path, x in jax.tree_util.tree_leaves_with_path(state.params)
            if P.layer_group_of(path) == "decoder" and "kernel" in jax.tree_util.keystr(path)
        }

    whole = tmp_path / "whole"
    with L.Trainer(_config(whole, **edits), devices=jax.devices()[:1]) as trainer:
        trainer.train()
        assert kernels(trainer.state) == {"pinned_host"} and trainer.state.compute_params
        final = jax.tree.map(np.asarray, trainer.state)
    part = tmp_path / "part"
    with L.Trainer(
        _config(part, ["steps=2", "optimizer.decay_steps=4"], **edits), devices=jax.devices()[:1]
    ) as t:
        t.train()
    with L.Trainer(
        _config(part, ["steps=4", "optimizer.decay_steps=4"], **edits),
        resume=True,
        devices=jax.devices()[:1],
    ) as trainer:
        assert trainer.resumed_from == 2
        assert kernels(trainer.state) == {"pinned_host"}  # restored into host memory
        assert _host_kinds(trainer.state) == {"pinned_host"}
        trainer.train()
        resumed = jax.tree.map(np.asarray, trainer.state)
    leaves = jax.tree.leaves(final)
    assert len(leaves) == len(jax.tree.leaves(resumed)) > len(jax.tree.leaves(final.params)) * 3
    for a, b in zip(leaves, jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_unrunnable_state_refused_before_the_run_directory(tmp_path):
    run = tmp_path / "run"
    # A clipped optimizer with streamed moments runs (two passes: tests/test_state_offload_step).
    _config(run, optimizer={"lr": 0.01, "warmup_steps": 2, "grad_clip": 1.0})
    plan = {**RUN["plan"], "state": {"decoder": {"grad_accum": "offload"}}}
    # An offloaded accumulator with one microbatch per update: the run has none to place.
    with pytest.raises(TieraxError, match=r"accumulator of decoder.*grad_accum = 1"):
        _config(run, plan=plan)
    assert not run.exists()
    assert not run.exists()
