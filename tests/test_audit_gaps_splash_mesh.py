"""Splash attention on a multi-device mesh with packed documents (issue 60's audit gap: every
other splash test runs on one device, so a mesh run that dropped the segment ids — packed
documents attending to each other — went unseen).

The train step's loss runs on a 4-device FSDP mesh (the kernel per shard under ``shard_map``) with
the kernel in Pallas's interpreter (the only way it runs off a TPU; ``interpret=True`` is the
kernel's own switch).  Reference: each document alone in a row of its own, padded with tokens each
in a segment of their own (as tests/test_document_mask.py) — same loss, same gradients."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax import plan as plan_lib
from tierax.mesh import make_mesh
from tierax.models import attention as A
from tierax.models import get_config
from tierax.train import step as S

T = 129  # seq 128 (the kernel's block) + the shifted target
ROWS = [[60, 69], [40, 50, 39]]  # two packed rows, each 129 tokens
R = 8  # rows of the batch: two per device on the 4-device mesh
PAD = 1000


def _batches(vocab: int):
    rng = np.random.default_rng(0)
    docs = [[rng.integers(1, vocab, n) for n in lens] for lens in ROWS]
    pad_seg = np.broadcast_to(PAD + np.arange(T, dtype=np.int32), (R, T))
    packed, packed_seg = np.zeros((R, T), np.int32), pad_seg.copy()
    for r, lens in enumerate(ROWS):
        packed[r] = np.concatenate(docs[r])
        packed_seg[r] = np.repeat(np.arange(len(lens)), lens)
    alone, alone_seg = np.zeros((R, T), np.int32), pad_seg.copy()
    for i, d in enumerate(d for row in docs for d in row):
        alone[i, : len(d)] = d
        alone_seg[i, : len(d)] = 0
    return (packed, packed_seg), (alone, alone_seg)


def test_packed_documents_on_a_4_device_mesh_equal_each_document_alone(monkeypatch):
    assert len(jax.devices()) >= 4
    monkeypatch.setattr(
        A, "splash_attention", functools.partial(A.splash_attention, interpret=True)
    )
    cfg = dataclasses.replace(get_config("tiny-llama"), attention="splash", num_layers=2)
    mesh = make_mesh(fsdp=4, devices=jax.devices()[:4])
    graphdef, params = S.init_params(cfg, seed=3, mesh=mesh)
    policies = plan_lib.to_policies(plan_lib.preset("save-all", cfg), cfg)
    grad = jax.jit(jax.value_and_grad(S.make_loss_fn(graphdef, policies, mesh)))
    (packed, pseg), (alone, aseg) = _batches(cfg.vocab_size)
    lp, gp = grad(params, jnp.asarray(packed), jnp.asarray(pseg))
    la, ga = grad(params, jnp.asarray(alone), jnp.asarray(aseg))
    assert float(lp) == pytest.approx(float(la), rel=2e-5)
    for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(ga), strict=True):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-4 * float(jnp.max(jnp.abs(b))) + 1e-7
