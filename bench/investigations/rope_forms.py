#!/usr/bin/env python3
"""Two forms of rotary embedding in tierax's train step, timed side by side on the chip.

Question: does XLA:TPU's layout of the rotate-half RoPE cost step time, and does another form of
the same arithmetic avoid it?  Answered on the v5e chip: yes — the permutation form's step is
faster at head dim 64 and at 128 (the record's ``matmul_over_split``), and tierax's models now use
it on a TPU (tierax.models.layers.rope).

The chip's profile of a head-dim-64 step
(bench/results/chip/profiles/hd64_remat_full_ops.json) spends tens of ms in fusions over the rotary
halves, ``[b, s, h, d/2]`` arrays whose minor dimension (32 at head dim 64) XLA:TPU pads to 128
lanes.  The forms, equal value for value (the check below):

* ``split``: ``concat([x1·cos − x2·sin, x2·cos + x1·sin])`` from the halves ``x1, x2``;
* ``matmul``: ``x·cos' + (x @ R)·sin'``, ``R`` the signed permutation taking ``x`` to
  ``concat([−x2, x1])`` (one ±1 term per output: exact) and ``cos'``, ``sin'`` the angles
  repeated over both halves: no array of half the head dim.

Per head dim (64, 128; the chip check's dense shape otherwise), both steps are compiled once, then
timed in interleaved rounds, each round on a fresh state (one state on the chip at a time).

Records: bench/results/chip/rope_forms.json
Docs: docs/guide/tpu.md

    PYTHONPATH=src python3 bench/investigations/rope_forms.py --out $OUT/rope_forms.json  # chip
    PYTHONPATH=src python3 bench/investigations/rope_forms.py --tiny                      # CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402 — it imports tierax, found through src


def _angles(x, theta):
    import jax.numpy as jnp

    seq, dim = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    a = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.sin(a)[None, :, None, :], jnp.cos(a)[None, :, None, :]


def rope_split(x, theta, positions_BS=None):
    import jax.numpy as jnp

    assert positions_BS is None
    sin, cos = _angles(x, theta)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rope_matmul(x, theta, positions_BS=None):
    import jax.numpy as jnp

    assert positions_BS is None
    sin, cos = _angles(x, theta)
    half = x.shape[-1] // 2
    eye, zero = jnp.eye(half, dtype=x.dtype), jnp.zeros((half, half), x.dtype)
    r = jnp.block([[zero, eye], [-eye, zero]])
    rotated = jnp.einsum("bshd,de->bshe", x, r, preferred_element_type=jnp.float32)
    cos, sin = jnp.concatenate([cos, cos], -1), jnp.concatenate([sin, sin], -1)
    return (x.astype(jnp.float32) * cos + rotated * sin).astype(x.dtype)


FORMS = {"split": rope_split, "matmul": rope_matmul}


def _config(head_dim: int, tiny: bool):
    import jax

    from tierax.models import apply_overrides, get_config
    from tierax.models.config import for_platform

    d = 128 if tiny else 2048
    heads = d // head_dim
    cfg = apply_overrides(
        get_config("tiny-llama"),
        [
            f"d_model={d}",
            f"num_layers={2 if tiny else 8}",
            f"mlp_dim={4 * d}",
            f"num_heads={heads}",
            f"num_kv_heads={max(1, heads // 2)}",
            f"head_dim={head_dim}",
            "vocab_size=32000",
            "dtype=bfloat16",
            "attention=auto",
        ],
    )
    return for_platform(cfg, jax.default_backend())


def run(head_dims, microbatch: int, seq: int, steps: int, rounds: int, tiny: bool) -> list:
    import jax
    import jax.numpy as jnp

    from tierax import plan as plan_lib
    from tierax.models import layers
    from tierax.train import step as step_lib

    x = jax.random.normal(jax.random.key(0), (2, 16, 4, 64)).astype(jnp.bfloat16)
    same = bool((rope_split(x, 1e4) == rope_matmul(x, 1e4)).all())
    out = []
    for hd in head_dims:
        cfg = _config(hd, tiny)
        plan = plan_lib.preset("remat-full", cfg)
        optimizer = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
        tokens = step_lib.synthetic_batch(cfg, microbatch, seq)
        compiled, row = {}, {"head_dim": hd, "forms_equal": same, "times_s": {}}
        original = layers.rope
        try:
            for name, form in FORMS.items():
                layers.rope = form
                graphdef, state = step_lib.init_state(cfg, optimizer, plan=plan)
                fn = step_lib.make_train_step(graphdef, cfg, plan, optimizer)
                t0 = time.perf_counter()
                compiled[name] = fn.lower(state, tokens).compile()
                row[f"compile_s_{name}"] = time.perf_counter() - t0
                del state
                gc.collect()
        finally:
            layers.rope = original
        for _ in range(rounds):
            for name, exe in compiled.items():
                _, state = step_lib.init_state(cfg, optimizer, plan=plan)
                state, metrics = exe(state, tokens)  # a fresh state's first step: not timed
                jax.block_until_ready(state)
                for _ in range(steps):
                    t0 = time.perf_counter()
                    state, metrics = exe(state, tokens)
                    jax.block_until_ready(state)
                    row["times_s"].setdefault(name, []).append(time.perf_counter() - t0)
                row[f"loss_{name}"] = float(metrics["loss"])
                del state, metrics
                gc.collect()
        med = {k: statistics.median(v) for k, v in row["times_s"].items()}
        row["median_s"] = med
        row["matmul_over_split"] = med["matmul"] / med["split"]
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "times_s"}), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the CPU rehearsal at toy sizes")
    ap.add_argument("--out", type=_common.out_path, help="the JSON record to write")
    args = ap.parse_args(argv)
    import jax

    if args.tiny:
        rows = run((64,), 2, 128, 2, 1, True)
    else:
        rows = run((64, 128), 8, 2048, 4, 3, False)
    doc = _common.envelope("tierax.rope-forms/1", argv, devices=True)
    doc |= {
        "platform": jax.default_backend(),
        "microbatch": 2 if args.tiny else 8,
        "seq": 128 if args.tiny else 2048,
        "plan": "remat-full",
        "rows": rows,
    }
    if args.out:
        _common.write_record(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
