#!/usr/bin/env python3
"""A pure-JAX Llama-style train step that does not import tierax: the yardstick for `tierax bench`.

The same math as tierax's Llama step, written directly in nanoGPT style: token
embedding → ``lax.scan`` over stacked layers (pre-norm RMSNorm, RoPE, causal softmax
attention, SwiGLU MLP; the body under ``jax.checkpoint`` with nothing saved for
``remat="full"``, no checkpoint for ``"none"``) → RMSNorm → untied LM head →
next-token cross-entropy (float32 logits) → AdamW (b1 0.9, b2 0.95, eps 1e-8, weight
decay 0.1, lr 1e-3: tierax bench's optimizer).  Parameters are float32 (master weights),
compute is ``dtype``; norms, RoPE and softmax run in float32.  The step returns the loss
and the gradient norm like tierax's.

    python bench/reference_step.py [--d-model 256 --dtype float32 --remat full --steps 5]

prints the parameter count, the loss at initialisation (≈ ln vocab) and step times.
``bench/peer_maxtext.py`` imports :func:`make` to time it against tierax and MaxText.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import time

# An installed CUDA plugin or libtpu must not try to start on a machine without its device; where a
# GPU or a TPU (/dev/accel*, or a VFIO group beside the container /dev/vfio/vfio) is present, JAX
# picks it.
_TPU = glob.glob("/dev/accel*") or [g for g in glob.glob("/dev/vfio/*") if not g.endswith("/vfio")]
if not (os.path.exists("/proc/driver/nvidia") or _TPU):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def init_params(key, *, vocab: int, d: int, layers: int, heads: int, head_dim: int, mlp: int):
    """float32 parameters; per-layer weights stacked on a leading ``layers`` axis."""
    ks = iter(jax.random.split(key, 9))

    def w(shape, fan_in):
        return jax.random.truncated_normal(next(ks), -2.0, 2.0, shape, jnp.float32) * fan_in**-0.5

    L, hd = layers, heads * head_dim
    return {
        "embed": jax.random.normal(next(ks), (vocab, d), jnp.float32),
        "layers": {
            "attn_norm": jnp.ones((L, d)),
            "mlp_norm": jnp.ones((L, d)),
            "wq": w((L, d, hd), d),
            "wk": w((L, d, hd), d),
            "wv": w((L, d, hd), d),
            "wo": w((L, hd, d), hd),
            "wi_0": w((L, d, mlp), d),
            "wi_1": w((L, d, mlp), d),
            "wo_mlp": w((L, mlp, d), mlp),
        },
        "final_norm": jnp.ones((d,)),
        "head": w((d, vocab), d),
    }


def rms_norm(x, scale, eps=1e-5):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps) * scale).astype(
        x.dtype
    )


def rope(x, theta=500_000.0):  # x [B, S, H, d], rotate-half form
    S, d = x.shape[1], x.shape[-1]
    ang = jnp.arange(S, dtype=jnp.float32)[:, None] * theta ** (
        -jnp.arange(0, d, 2, dtype=jnp.float32) / d
    )
    sin, cos = jnp.sin(ang)[:, None, :], jnp.cos(ang)[:, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, -1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def layer(x, p, heads: int, dtype):
    B, S, D = x.shape
    c = lambda a: a.astype(dtype)  # noqa: E731  (weights to the compute dtype)
    h = rms_norm(x, p["attn_norm"])
    q = rope((h @ c(p["wq"])).reshape(B, S, heads, -1))
    k = rope((h @ c(p["wk"])).reshape(B, S, heads, -1))
    v = (h @ c(p["wv"])).reshape(B, S, heads, -1)
    s = jnp.einsum("bshd,bthd->bhst", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, jnp.finfo(jnp.float32).min)
    a = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(s, -1).astype(dtype), v).reshape(B, S, -1)
    x = x + a @ c(p["wo"])
    h = rms_norm(x, p["mlp_norm"])
    return x + (jax.nn.silu(h @ c(p["wi_0"])) * (h @ c(p["wi_1"]))) @ c(p["wo_mlp"])


def loss_fn(params, tokens, *, heads: int, dtype, remat: str):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = params["embed"].astype(dtype)[inputs]
    body = lambda x, p: (layer(x, p, heads, dtype), None)  # noqa: E731
    if remat == "full":
        body = jax.checkpoint(
            body, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False
        )
    x, _ = jax.lax.scan(body, x, params["layers"])
    h = rms_norm(x, params["final_norm"])
    logits = jnp.einsum(
        "bsd,dv->bsv", h, params["head"].astype(dtype), preferred_element_type=jnp.float32
    )
    lse = jax.nn.logsumexp(logits, -1)
    target = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return jnp.mean(lse - target)


def adamw(params, grads, m, v, step, *, lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
    t = step + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    c1, c2 = 1 - b1**t, 1 - b2**t
    params = jax.tree.map(
        lambda p, m, v: p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + wd * p), params, m, v
    )
    return params, m, v


def make(
    *,
    d_model: int,
    dtype: str = "float32",
    remat: str = "full",
    layers: int = 4,
    vocab: int = 32000,
    batch: int = 4,
    seq: int = 256,
    seed: int = 0,
):
    """(jitted step(state, tokens) -> (state, metrics) with the state donated, state,
    tokens [batch, seq+1])."""
    heads, head_dim, mlp = d_model // 64, 64, 4 * d_model
    dt = jnp.dtype(dtype)
    params = jax.jit(
        lambda k: init_params(
            k, vocab=vocab, d=d_model, layers=layers, heads=heads, head_dim=head_dim, mlp=mlp
        )
    )(jax.random.key(seed))
    zeros = jax.tree.map(jnp.zeros_like, params)
    state = (params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))

    def step(state, tokens):
        params, m, v, n = state
        loss, grads = jax.value_and_grad(loss_fn)(
            params, tokens, heads=heads, dtype=dt, remat=remat
        )
        gnorm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
        params, m, v = adamw(params, grads, m, v, n)
        return (params, m, v, n + 1), {"loss": loss, "grad_norm": gnorm}

    tokens = jax.random.randint(
        jax.random.key(seed + 1), (batch, seq + 1), 0, vocab, dtype=jnp.int32
    )
    return jax.jit(step, donate_argnums=(0,)), state, tokens


def param_count(state) -> int:
    return sum(x.size for x in jax.tree.leaves(state[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--remat", default="full", choices=["full", "none"])
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)
    step, state, tokens = make(d_model=args.d_model, dtype=args.dtype, remat=args.remat)
    print(f"params {param_count(state):,}; ln(vocab) = {math.log(32000):.4f}")
    for i in range(args.steps):
        t = time.perf_counter()
        state, metrics = step(state, tokens)
        jax.block_until_ready(state)
        print(f"step {i}: loss {float(metrics['loss']):.4f}  {time.perf_counter() - t:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
