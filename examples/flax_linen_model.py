#!/usr/bin/env python3
"""Plan a Flax Linen model with tierax's Python API, then check the plan keeps the gradients.

A small pre-norm transformer written with Flax Linen: ``nn.scan`` over ``nn.remat``'d
blocks (its own layer scan), activations tagged with ``checkpoint_name`` in tierax's
(= MaxText's) names.  The remat policy is a constructor argument, so the planned
policy plugs in directly::

    inv = tierax.inventory(loss_fn, params, batch)      # abstract trace
    planned = tierax.plan(inv, target="h200", budget=...)
    model = Model(policy=planned.policy("decoder"))

Run: ``.venv/bin/python examples/flax_linen_model.py [--layers 4 --d-model 64 --seq 32 --batch 2
--squeeze 0.95]``. On CPU, offloaded names stay on device (XLA:CPU strips the placement), so the
gradient check compares the planned policy's gradients with no remat at all.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

import tierax  # noqa: E402


# --8<-- [start:model]
class Block(nn.Module):
    d_model: int
    heads: int
    mlp: int

    @nn.compact
    def __call__(self, x, _):
        b, s, d = x.shape
        hd = d // self.heads
        h = nn.RMSNorm()(x)
        q = checkpoint_name(
            nn.DenseGeneral((self.heads, hd), use_bias=False, name="q")(h), "query_proj"
        )
        k = checkpoint_name(
            nn.DenseGeneral((self.heads, hd), use_bias=False, name="k")(h), "key_proj"
        )
        v = checkpoint_name(
            nn.DenseGeneral((self.heads, hd), use_bias=False, name="v")(h), "value_proj"
        )
        scores = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(hd)
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
        ctx = checkpoint_name(
            jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores), v), "attention_out"
        )
        x = x + checkpoint_name(
            nn.DenseGeneral(d, axis=(-2, -1), use_bias=False, name="o")(ctx), "out_proj"
        )
        h = nn.RMSNorm()(x)
        gate = checkpoint_name(nn.Dense(self.mlp, use_bias=False, name="wi_0")(h), "mlpwi_0")
        up = checkpoint_name(nn.Dense(self.mlp, use_bias=False, name="wi_1")(h), "mlpwi_1")
        x = x + checkpoint_name(nn.Dense(d, use_bias=False, name="wo")(nn.silu(gate) * up), "mlpwo")
        return x, None


class Model(nn.Module):
    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    mlp: int = 128
    layers: int = 4
    policy: object = None  # a jax.checkpoint policy: tierax's plan.policy("decoder")

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


# --8<-- [end:model]
def run(layers=4, d_model=64, seq=32, batch=2, target="h200", budget=None, squeeze=None) -> dict:
    """Inventory, plan (``squeeze``: budget = XLA:GPU's fixed buffers plus that fraction of
    what the unconstrained plan needs beside them),
    gradient check."""
    base = Model(d_model=d_model, layers=layers)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq + 1), 0, base.vocab)
    params = base.init(jax.random.PRNGKey(0), tokens[:, :-1])["params"]

    inv = tierax.inventory(loss_fn_for(base), params, tokens)
    if squeeze:
        free = tierax.plan(inv, target=target).predicted
        fixed = free.breakdown.fixed_device_bytes  # XLA:GPU's own buffers: no plan moves them
        budget = fixed + squeeze * (free.peak_device_bytes - fixed)
    planned = tierax.plan(inv, target=target, budget=budget)
    planned_model = Model(d_model=d_model, layers=layers, policy=planned.policy("decoder"))

    reference = jax.grad(loss_fn_for(Model(d_model=d_model, layers=layers, policy=None)))(
        params, tokens
    )
    grads = jax.grad(loss_fn_for(planned_model))(params, tokens)
    worst = max(
        float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-30))
        for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(grads), strict=False)
    )
    return {"inventory": inv, "planned": planned, "budget": budget, "max_rel_grad_error": worst}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--target", default="h200")
    p.add_argument("--budget-mib", type=float, help="device budget per device, MiB")
    p.add_argument(
        "--squeeze",
        type=float,
        default=0.95,
        help="budget: XLA:GPU's fixed buffers plus this fraction of what the unconstrained plan "
        "needs beside them (default 0.95; ignored with "
        "--budget-mib)",
    )
    a = p.parse_args()
    out = run(
        a.layers,
        a.d_model,
        a.seq,
        a.batch,
        a.target,
        a.budget_mib and a.budget_mib * 2**20,
        squeeze=None if a.budget_mib else a.squeeze,
    )
    for g in out["inventory"].inventory.groups:
        for act in g.activations:
            print(
                f"{g.name}/{act.name}: {act.bytes_per_layer:,} B/layer × {act.num_layers}, "
                f"recompute {act.recompute_flops_per_layer / 1e6:.2f} MFLOP/layer"
            )
    planned = out["planned"]
    print("plan:", planned.placements())
    pred = planned.predicted
    print(
        f"predicted step {pred.step_time_s * 1e6:.1f} µs, peak "
        f"{pred.peak_device_bytes / 2**20:.2f} MiB"
    )
    print(f"gradients vs no remat: max relative error {out['max_rel_grad_error']:.2e}")


if __name__ == "__main__":
    import sys

    from tierax.errors import TieraxError

    try:
        main()
    except TieraxError as e:  # bad input (e.g. a budget no plan fits): one line, exit 2
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr)
        sys.exit(2)
