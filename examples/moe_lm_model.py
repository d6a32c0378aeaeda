#!/usr/bin/env python3
"""Plan a plain-JAX mixture-of-experts language model with its own LM head and loss.

A user's model, not tierax's: token embedding, a ``lax.scan`` over layers each running
``jax.checkpoint(layer, policy=...)`` (RMS norm, a softmax router choosing the top-k of a few
experts, a capacity-limited dispatch by sort and gather, batched SwiGLU expert GEMMs, a gather
combine), a final norm, an LM head ``[d, vocab]`` and softmax cross-entropy — optionally over
token tiles (``tiles`` > 1: a ``lax.scan`` over tiles, each tile's logits recomputed in the
backward).  ``tierax.inventory`` reads from the trace of its gradient what the loss phase and the
routed-expert layers' backward hold (:mod:`tierax.tracing.loss_phase`), so the plan prices
them::

    inv = tierax.inventory(loss_fn(None), params, batch)
    planned = tierax.plan(inv, target="h100")
    step = train_step(planned.policy("moe"))          # value_and_grad + AdamW

Run: ``.venv/bin/python examples/moe_lm_model.py [--tiles 4] [--budget-gib 5.5] [--size vocab=4096
...] [--compile-for h100]``.  ``--compile-for`` also compiles the planned training step for that GPU
without a GPU (deviceless XLA:GPU; tierax's gpu-aot extra) and prints XLA's peak beside the
prediction.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

import tierax  # noqa: E402

TOP_K = 2
CAPACITY_FACTOR = 1.25
SIZES = {"vocab": 32768, "d": 1024, "f": 1024, "experts": 8, "layers": 4, "batch": 4, "seq": 2048}


def rms_norm(x, w):
    x32 = x.astype(jnp.float32)
    w = w.reshape((1,) * (x.ndim - 1) + w.shape)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32**2, -1, keepdims=True) + 1e-6) * w
    return y.astype(x.dtype)


def capacity(tokens: int, experts: int) -> int:
    return int(tokens * TOP_K * CAPACITY_FACTOR / experts)


def moe_layer(x, p):
    """Pre-norm routed experts with a residual: ``x + Σ_k gate_k · expert_k(norm(x))``."""
    B, S, D = x.shape
    T, E = B * S, p["router"].shape[-1]
    C = capacity(T, E)
    h = rms_norm(x, p["norm"]).reshape(T, D)
    scores = jax.nn.softmax(jnp.dot(h.astype(jnp.float32), p["router"]), -1)
    top, expert = jax.lax.top_k(scores, TOP_K)
    gates = top / jnp.sum(top, -1, keepdims=True)
    # Dispatch: each expert's assignments in token order, the first C kept ([E, C, D] by gather).
    flat = expert.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    counts = jnp.zeros((E,), jnp.int32).at[flat].add(1)
    starts = jnp.cumsum(counts) - counts
    slot = (
        jnp.zeros_like(flat)
        .at[order]
        .set(jnp.arange(T * TOP_K, dtype=jnp.int32) - starts[flat[order]])
    )
    c = jnp.arange(C, dtype=jnp.int32)
    pos = jnp.minimum(starts[:, None] + c[None, :], T * TOP_K - 1)
    token = jnp.where(c[None, :] < counts[:, None], order[pos] // TOP_K, T)  # T: an empty slot
    buf = h.at[token].get(mode="fill", fill_value=0)
    dt = x.dtype
    gate = checkpoint_name(jnp.einsum("ecd,edf->ecf", buf, p["wi_0"].astype(dt)), "moe_gate")
    up = checkpoint_name(jnp.einsum("ecd,edf->ecf", buf, p["wi_1"].astype(dt)), "moe_up")
    y = jnp.einsum("ecf,efd->ecd", jax.nn.silu(gate) * up, p["wo"].astype(dt))
    y = checkpoint_name(y, "moe_out")
    # Combine: each choice's row gathered back (a dropped one reads 0), weighted by its gate.
    slot = slot.reshape(T, TOP_K)
    out = 0
    for j in range(TOP_K):
        row = y.at[expert[:, j], slot[:, j]].get(mode="fill", fill_value=0)
        out = out + row * gates[:, j : j + 1].astype(dt)
    return x + out.reshape(B, S, D)


def cross_entropy(x, head, labels):
    """Per-token softmax cross-entropy of the logits ``x · head`` (float32)."""
    logits = jnp.dot(x, head.astype(x.dtype), preferred_element_type=jnp.float32)
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]


def loss_fn(policy, tiles: int = 1):
    """The mean next-token loss, the layers under ``jax.checkpoint(policy=policy)``."""

    def loss(params, batch):
        tokens, labels = batch["tokens"], batch["labels"]
        x = params["embed"][tokens].astype(jnp.bfloat16)

        def body(h, p):
            return jax.checkpoint(moe_layer, policy=policy, prevent_cse=False)(h, p), None

        with jax.named_scope("tierax_group_moe"):
            x, _ = jax.lax.scan(body, x, params["layers"])
        x = rms_norm(x, params["final_norm"])
        if tiles == 1:
            return jnp.mean(cross_entropy(x, params["head"], labels))
        B, S, D = x.shape
        xs = (x.reshape(tiles, B * S // tiles, D), labels.reshape(tiles, B * S // tiles))

        def tile(total, xl):
            nll = jax.checkpoint(cross_entropy)(xl[0], params["head"], xl[1])
            return total + jnp.sum(nll), None

        total, _ = jax.lax.scan(tile, jnp.zeros((), jnp.float32), xs)
        return total / (B * S)

    return loss


def shapes(vocab, d, f, experts, layers, batch, seq):
    """(params, batch) as ShapeDtypeStructs: nothing is allocated."""
    S, f32 = jax.ShapeDtypeStruct, jnp.float32
    params = {
        "embed": S((vocab, d), f32),
        "head": S((d, vocab), f32),
        "final_norm": S((d,), f32),
        "layers": {
            "norm": S((layers, d), f32),
            "router": S((layers, d, experts), f32),
            "wi_0": S((layers, experts, d, f), f32),
            "wi_1": S((layers, experts, d, f), f32),
            "wo": S((layers, experts, f, d), f32),
        },
    }
    return params, {"tokens": S((batch, seq), jnp.int32), "labels": S((batch, seq), jnp.int32)}


def train_step(policy, tiles: int = 1):
    """One AdamW step of the loss (what the plan's state accounts for: parameters, gradients
    and two moments), returning the new parameters, optimizer state and the loss."""
    import optax

    opt = optax.adamw(1e-4)

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn(policy, tiles))(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, opt


def plan(sizes=None, *, target="h100", budget=None, tiles: int = 1):
    """(inventory, planned) of the model at ``sizes`` (default :data:`SIZES`)."""
    params, batch = shapes(**(sizes or SIZES))
    inv = tierax.inventory(loss_fn(None, tiles), params, batch)
    return inv, tierax.plan(inv, target=target, budget=budget)


def compile_peak(policy, target: str, sizes=None, tiles: int = 1) -> int:
    """XLA:GPU's peak device bytes (arguments + outputs + temp − aliased, as tierax reads its own
    compiles) of the training step under ``policy`` compiled for ``target`` here, deviceless,
    parameters and optimizer state donated.

    Call ``tierax.launch.start(deviceless_gpu=True)`` before JAX starts (``main`` does).
    """
    from jax.sharding import SingleDeviceSharding

    from tierax import hardware
    from tierax.hardware.target_config import render_target_config, scheduling_target_config
    from tierax.xla import compile as tc

    tc.check_gpu_aot()
    config = scheduling_target_config(render_target_config(hardware.get_target(target)))
    on_gpu = SingleDeviceSharding(tc.gpu_topology(config, 1, target).devices[0])
    params, batch = shapes(**(sizes or SIZES))
    step, opt = train_step(policy, tiles)

    def place(tree):
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=on_gpu), tree)

    args = place(params), place(jax.eval_shape(opt.init, params)), place(batch)
    with tc.without_persistent_cache():
        compiled = jax.jit(step, donate_argnums=(0, 1)).trace(*args).lower().compile()
    arg, out, alias, temp = tc.memory_figures(compiled.memory_analysis())
    return arg + out + temp - alias


def main() -> None:
    from tierax.errors import TieraxError

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiles", type=int, default=1, help="token tiles of the loss")
    p.add_argument("--budget-gib", type=float, help="device budget per device, GiB")
    p.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="KEY=N",
        help=f"a size other than the default {SIZES} (repeatable)",
    )
    p.add_argument("--target", default="h100")
    p.add_argument("--compile-for", metavar="GPU", help="also compile the step for this GPU")
    a = p.parse_args()
    if a.compile_for:
        from tierax import launch

        launch.start(deviceless_gpu=True)  # before JAX starts
    budget = a.budget_gib and a.budget_gib * 2**30
    sizes = dict(SIZES)
    for item in a.size:
        key, _, value = item.partition("=")
        if key not in SIZES or not value.isdigit() or int(value) < 1:
            raise TieraxError(f"--size {item!r}: give KEY=N with KEY one of {', '.join(SIZES)}")
        sizes[key] = int(value)
    inv, planned = plan(sizes, target=a.target, budget=budget, tiles=a.tiles)
    prog = planned.program
    print(f"head: {prog.head}; the loss phase holds {prog.loss_bytes / 2**20:.1f} MiB")
    print(f"MoE backward buffers: {dict(prog.moe_backward_bytes)} bytes")
    print("plan:", planned.placements())
    peak = planned.predicted.peak_device_bytes
    print(f"predicted peak {peak / 2**30:.3f} GiB ({planned.predicted.breakdown.peak_phase})")
    if a.compile_for:
        xla = compile_peak(planned.policy("moe"), a.compile_for, sizes, tiles=a.tiles)
        print(
            f"compiled for {a.compile_for} (deviceless): peak {xla / 2**30:.3f} GiB, "
            f"prediction {(peak - xla) / xla:+.2%}"
        )


if __name__ == "__main__":
    import sys

    from tierax.errors import TieraxError

    try:
        main()
    except TieraxError as e:
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr)
        sys.exit(2)
