#!/usr/bin/env python3
"""Plan an Equinox model with tierax's Python API, then check the plan keeps the gradients.

A small pre-norm MLP-mixer-style decoder written with Equinox: the layers are built
stacked (``eqx.filter_vmap`` over the layer keys) and run by a ``jax.lax.scan`` whose body
is ``jax.checkpoint``'ed with a policy (its own layer scan); activations are tagged with
``checkpoint_name`` in tierax's (= MaxText's) names.  The policy is an argument of the
forward pass, so the planned policy plugs in directly::

    inv = tierax.inventory(loss_fn, params, batch)      # abstract trace
    planned = tierax.plan(inv, target="h200", budget=...)
    loss = make_loss(static, policy=planned.policy("decoder"))

Run: ``.venv/bin/python examples/equinox_model.py [--layers 4 --d-model 64 --seq 32 --batch 2
--squeeze 0.85]``. Needs ``pip install equinox`` (in tierax's ``test`` extra).  On CPU, offloaded
names stay on device (XLA:CPU strips the placement), so the gradient check compares the planned
policy's gradients with no remat at all.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

import tierax  # noqa: E402


class Block(eqx.Module):
    """Token mixing over a causal window, then a SwiGLU channel MLP; both pre-norm, residual."""

    norm1: eqx.nn.RMSNorm
    q: eqx.nn.Linear
    k: eqx.nn.Linear
    v: eqx.nn.Linear
    o: eqx.nn.Linear
    norm2: eqx.nn.RMSNorm
    wi_0: eqx.nn.Linear
    wi_1: eqx.nn.Linear
    wo: eqx.nn.Linear

    def __init__(self, d: int, mlp: int, *, key):
        ks = jax.random.split(key, 7)
        lin = lambda i, o, k: eqx.nn.Linear(i, o, use_bias=False, key=k)  # noqa: E731
        self.norm1, self.norm2 = eqx.nn.RMSNorm(d), eqx.nn.RMSNorm(d)
        self.q, self.k, self.v, self.o = (
            lin(d, d, ks[0]),
            lin(d, d, ks[1]),
            lin(d, d, ks[2]),
            lin(d, d, ks[3]),
        )
        self.wi_0, self.wi_1, self.wo = lin(d, mlp, ks[4]), lin(d, mlp, ks[5]), lin(mlp, d, ks[6])

    def __call__(self, x_BSD):
        # Equinox layers act on one vector: vmap them over batch and sequence.  (The scan over
        # layers stays outside any vmap, so its named scope marks the layer group in the trace.)
        per_token = lambda layer, x: jax.vmap(jax.vmap(layer))(x)  # noqa: E731
        h = per_token(self.norm1, x_BSD)
        q = checkpoint_name(per_token(self.q, h), "query_proj")
        k = checkpoint_name(per_token(self.k, h), "key_proj")
        v = checkpoint_name(per_token(self.v, h), "value_proj")
        s = x_BSD.shape[1]
        scores = jnp.einsum("bsd,btd->bst", q, k) / jnp.sqrt(q.shape[-1])
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
        ctx = checkpoint_name(
            jnp.einsum("bst,btd->bsd", jax.nn.softmax(scores), v), "attention_out"
        )
        x_BSD = x_BSD + checkpoint_name(per_token(self.o, ctx), "out_proj")
        h = per_token(self.norm2, x_BSD)
        gate = checkpoint_name(per_token(self.wi_0, h), "mlpwi_0")
        up = checkpoint_name(per_token(self.wi_1, h), "mlpwi_1")
        return x_BSD + checkpoint_name(per_token(self.wo, jax.nn.silu(gate) * up), "mlpwo")


class Model(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: Block  # stacked: every leaf has a leading layer axis
    norm: eqx.nn.RMSNorm
    head: eqx.nn.Linear

    def __init__(self, vocab=256, d_model=64, mlp=128, layers=4, *, key):
        k_embed, k_blocks, k_head = jax.random.split(key, 3)
        self.embed = eqx.nn.Embedding(vocab, d_model, key=k_embed)
        self.blocks = eqx.filter_vmap(lambda k: Block(d_model, mlp, key=k))(
            jax.random.split(k_blocks, layers)
        )
        self.norm = eqx.nn.RMSNorm(d_model)
        self.head = eqx.nn.Linear(d_model, vocab, use_bias=False, key=k_head)

    def __call__(self, tokens_BS, policy=None):
        x = jax.vmap(jax.vmap(self.embed))(tokens_BS)
        params, static = eqx.partition(self.blocks, eqx.is_array)

        def body(x, layer_params):
            return eqx.combine(layer_params, static)(x), None

        if policy is not None:
            body = jax.checkpoint(body, policy=policy, prevent_cse=False)
        with jax.named_scope("tierax_group_decoder"):
            x, _ = jax.lax.scan(body, x, params)
        return jax.vmap(jax.vmap(lambda h: self.head(self.norm(h))))(x)


def make_loss(static, policy=None):
    """``loss(params, tokens_BT)``: mean next-token cross-entropy of ``params ∪ static``."""

    def loss(params, tokens_BT):
        model = eqx.combine(params, static)
        logits = model(tokens_BT[:, :-1], policy)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, tokens_BT[:, 1:, None], -1))

    return loss


def run(layers=4, d_model=64, seq=32, batch=2, target="h200", budget=None, squeeze=None) -> dict:
    """Inventory, plan (``squeeze``: budget = XLA:GPU's fixed buffers plus that fraction of
    what the unconstrained plan needs beside them),
    gradient check."""
    model = Model(d_model=d_model, layers=layers, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq + 1), 0, 256)

    # The inventory needs the scan's layer body rematted (any policy) to find it.
    inv = tierax.inventory(
        make_loss(static, jax.checkpoint_policies.nothing_saveable), params, tokens
    )
    if squeeze:
        free = tierax.plan(inv, target=target).predicted
        fixed = free.breakdown.fixed_device_bytes  # XLA:GPU's own buffers: no plan moves them
        budget = fixed + squeeze * (free.peak_device_bytes - fixed)
    planned = tierax.plan(inv, target=target, budget=budget)

    reference = jax.grad(make_loss(static))(params, tokens)
    grads = jax.grad(make_loss(static, planned.policy("decoder")))(params, tokens)
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
    p.add_argument(
        "--squeeze",
        type=float,
        default=0.85,
        help="budget: XLA:GPU's fixed buffers plus this fraction of what the unconstrained plan "
        "needs beside them (default %(default)s)",
    )
    a = p.parse_args()
    out = run(a.layers, a.d_model, a.seq, a.batch, a.target, squeeze=a.squeeze)
    for g in out["inventory"].inventory.groups:
        for act in g.activations:
            print(
                f"{g.name}/{act.name}: {act.bytes_per_layer:,} B/layer × {act.num_layers}, "
                f"recompute {act.recompute_flops_per_layer / 1e6:.2f} MFLOP/layer"
            )
    print("plan:", out["planned"].placements())
    print(
        f"gradients under the plan vs no remat: max relative error {out['max_rel_grad_error']:.2e}"
    )


if __name__ == "__main__":
    import sys

    from tierax.errors import TieraxError

    try:
        main()
    except TieraxError as e:  # bad input (e.g. a budget no plan fits): one line, exit 2
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr)
        sys.exit(2)
