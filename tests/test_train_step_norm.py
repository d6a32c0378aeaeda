"""The gradients' global norm beside Optax's Adam: where its squares are kept apart from the
update's (tierax.train.step.global_norm), checked against each compiler's own program.

XLA:CPU: with the barrier the step moves fewer bytes (its cost analysis).  XLA:TPU (a deviceless
v5e compile): without the barrier no reduction makes a pass of its own over a gradient — the norm
is fused into the update's pass —, and the barrier would add one such pass per gradient.
"""

from __future__ import annotations

import importlib.util
import math
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tierax.train import step as step_lib

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
# Gradient leaves of a step (float32), large enough that XLA:TPU keeps them in HBM.
SHAPES = [(2048, 2048), (2048, 4096), (4096, 2048), (2048,)]


def _update(platform: str):
    """Adam's update and the gradient norm of one step, the norm as ``platform``'s step takes
    it."""
    opt = optax.adamw(1e-3, b1=0.9, b2=0.95, weight_decay=0.1)

    def f(grads, state, params):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, step_lib.global_norm(grads, platform)

    return f, opt


def _args(sharding=None):
    tree = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for s in SHAPES]
    state = jax.eval_shape(_update("cpu")[1].init, tree)
    if sharding is not None:
        state = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state
        )
    return tree, state, tree


def _cpu_bytes(platform: str) -> float:
    ca = jax.jit(_update(platform)[0]).lower(*_args()).compile().cost_analysis()
    return (ca[0] if isinstance(ca, list) else ca)["bytes accessed"]


def test_the_cpu_step_keeps_the_norm_apart_and_moves_fewer_bytes():
    kept_apart, merged = _cpu_bytes("cpu"), _cpu_bytes("tpu")
    gradient_bytes = sum(4 * math.prod(s) for s in SHAPES)
    # merged by CSE, the shared square is written and read back: about two passes more
    assert merged - kept_apart >= gradient_bytes, (kept_apart, merged)


def _gradient_passes(platform: str, mesh) -> int:
    """Fusions of the compiled v5e program whose only result is a float32 scalar: a reduction's
    pass of its own over a gradient (fused into the update, the scalar is one result among the
    updated parameter and moments)."""
    rep = NamedSharding(mesh, PartitionSpec())
    text = jax.jit(_update(platform)[0]).lower(*_args(rep)).compile().as_text()
    scalar = re.compile(r"\s*(?:ROOT )?%[\w.\-]+ = f32\[\]\{[^}]*\} fusion\(")
    return sum(bool(scalar.match(line)) for line in text.splitlines())


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: XLA:TPU cannot compile here")
def test_the_tpu_step_fuses_the_norm_into_the_update(v5e_mesh):
    assert _gradient_passes("tpu", v5e_mesh) == 0
    # the barrier's program, compiled the same way: one pass of its own per gradient
    assert _gradient_passes("cpu", v5e_mesh) == len(SHAPES)


def test_every_step_takes_the_platform_it_is_compiled_for():
    mesh = Mesh(jax.devices()[:1], ("x",))
    assert step_lib.step_platform(mesh) == "cpu" == step_lib.step_platform(None)


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no TPU topology here")
def test_a_step_for_a_tpu_topology_takes_the_tpu(v5e_mesh):
    assert step_lib.step_platform(v5e_mesh) == "tpu"
