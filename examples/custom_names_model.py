#!/usr/bin/env python3
"""Plan a Flax model that tags activations with its own names, keep the plan as YAML, apply it.

tierax's Python API plans whatever names your layer tags with ``checkpoint_name``; they
need not be tierax's (MaxText's) names.  This pre-norm transformer block tags its
query/key norms ``"qk_norm"``, its MLP up projection ``"my_up"`` and its down projection
``"my_down"``::

    inv = tierax.inventory(loss_fn, params, tokens)          # finds qk_norm, my_up, my_down
    planned = tierax.plan(inv, target="h200", budget=...)
    path.write_text(planned.plan.to_yaml())                  # the plan, in your names
    policy = tierax.api.policy(path, inv, "decoder")         # checked against the trace
    model = Model(policy=policy)

A plan naming an activation the trace did not find (a typo) is refused with the valid names.
``--emit maxtext`` refuses such a plan: MaxText has no key for these names.

Run: ``.venv/bin/python examples/custom_names_model.py [--layers 4 --d-model 64 --seq 32
--batch 2 --squeeze 0.9 --plan-out PATH]``. On CPU, offloaded names stay on device (XLA:CPU
strips the placement), so the gradient check compares the planned policy's gradients with no
remat at all.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

import tierax  # noqa: E402
import tierax.api  # noqa: E402
from tierax.errors import TieraxError  # noqa: E402

NAMES = ("qk_norm", "my_up", "my_down")


class Block(nn.Module):
    d_model: int
    heads: int
    mlp: int

    @nn.compact
    def __call__(self, x, _):
        b, s, d = x.shape
        hd = d // self.heads
        h = nn.RMSNorm()(x)
        q = nn.DenseGeneral((self.heads, hd), use_bias=False, name="q")(h)
        k = nn.DenseGeneral((self.heads, hd), use_bias=False, name="k")(h)
        v = nn.DenseGeneral((self.heads, hd), use_bias=False, name="v")(h)
        # One tag on both normalised projections (as a qk-norm model would name them).
        q = checkpoint_name(nn.RMSNorm(name="q_norm")(q), "qk_norm")
        k = checkpoint_name(nn.RMSNorm(name="k_norm")(k), "qk_norm")
        scores = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(hd)
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
        ctx = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores), v)
        x = x + nn.DenseGeneral(d, axis=(-2, -1), use_bias=False, name="o")(ctx)
        h = nn.RMSNorm()(x)
        up = checkpoint_name(nn.Dense(self.mlp, use_bias=False, name="up")(h), "my_up")
        down = checkpoint_name(nn.Dense(d, use_bias=False, name="down")(nn.gelu(up)), "my_down")
        return x + down, None


class Model(nn.Module):
    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    mlp: int = 256
    layers: int = 4
    policy: object = None  # a jax.checkpoint policy: tierax.api.policy(plan, inv, "decoder")

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.d_model)(tokens)
        block = nn.remat(Block, policy=self.policy, prevent_cse=False)
        with jax.named_scope("tierax_group_decoder"):
            x, _ = nn.scan(
                block, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers
            )(self.d_model, self.heads, self.mlp)(x, None)
        return nn.Dense(self.vocab, use_bias=False)(nn.RMSNorm()(x))


def loss_fn_for(model: Model):
    def loss_fn(params, tokens):
        logits = model.apply({"params": params}, tokens[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    return loss_fn


def run(layers=4, d_model=64, seq=32, batch=2, target="h200", squeeze=0.9, plan_out=None) -> dict:
    """Inventory, plan (budget = XLA:GPU's fixed buffers plus ``squeeze`` × what the unconstrained
    plan needs beside them), the plan written
    to ``plan_out`` as YAML (None: a temporary file) and read back as a policy, then the gradient
    check."""
    base = Model(d_model=d_model, layers=layers)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq + 1), 0, base.vocab)
    params = base.init(jax.random.PRNGKey(0), tokens[:, :-1])["params"]

    inv = tierax.inventory(loss_fn_for(base), params, tokens)
    free = tierax.plan(inv, target=target).predicted
    fixed = free.breakdown.fixed_device_bytes  # XLA:GPU's own buffers: no plan moves them
    budget = fixed + squeeze * (free.peak_device_bytes - fixed)
    planned = tierax.plan(inv, target=target, budget=budget)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(plan_out) if plan_out else pathlib.Path(tmp) / "plan.yaml"
        path.write_text(planned.plan.to_yaml(), encoding="utf-8")
        policy = tierax.api.policy(str(path), inv, "decoder")

    reference = jax.grad(loss_fn_for(Model(d_model=d_model, layers=layers)))(params, tokens)
    grads = jax.grad(loss_fn_for(Model(d_model=d_model, layers=layers, policy=policy)))(
        params, tokens
    )
    worst = max(
        float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-30))
        for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(grads), strict=True)
    )
    return {
        "inventory": inv,
        "planned": planned,
        "budget": budget,
        "policy": policy,
        "params": params,
        "tokens": tokens,
        "max_rel_grad_error": worst,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--target", default="h200")
    p.add_argument(
        "--squeeze",
        type=float,
        default=0.9,
        help="budget: XLA:GPU's fixed buffers plus this fraction of what the unconstrained plan "
        "needs beside them (default 0.9)",
    )
    p.add_argument("--plan-out", help="write the plan YAML here (default: a temporary file)")
    a = p.parse_args()
    if a.plan_out and pathlib.Path(a.plan_out).exists():
        print(f"error: --plan-out {a.plan_out} exists; give a new path", file=sys.stderr)
        return 2
    try:
        out = run(a.layers, a.d_model, a.seq, a.batch, a.target, a.squeeze, a.plan_out)
    except TieraxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for g in out["inventory"].inventory.groups:
        for act in g.activations:
            print(
                f"{g.name}/{act.name}: {act.bytes_per_layer:,} B/layer × {act.num_layers}, "
                f"recompute {act.recompute_flops_per_layer / 1e6:.2f} MFLOP/layer"
            )
    print("plan:", out["planned"].placements())
    pred = out["planned"].predicted
    print(
        f"predicted step {pred.step_time_s * 1e6:.1f} µs, peak "
        f"{pred.peak_device_bytes / 2**20:.2f} MiB"
    )
    print(f"gradients vs no remat: max relative error {out['max_rel_grad_error']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
