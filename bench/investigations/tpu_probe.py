#!/usr/bin/env python3
"""What a TPU machine shows tierax before the chip check is written around it: the device files and
variables the platform choice reads, XLA:TPU's memory analysis of a step under a remat, an
activation-offload and a state-offload plan, and the rates of back-to-back GEMMs, copies to and from
pinned host memory inside a jitted program (alone and beside GEMMs) and the splash kernel.

Question: what does the lent v5e show that tierax's platform choice, memory figures and rates must
follow?  Answered: its chip is a VFIO group (/dev/vfio/N), not /dev/accel*; XLA:TPU's own
peak_memory_in_bytes is its peak (arguments + temp over-count); a donated host state is one buffer
(host alias); a lone small matmul measures Python's dispatch, back-to-back bursts the chip.
Records: bench/results/tpu_probe.json
Docs: docs/results/tpu-check.md

    PYTHONPATH=src python3 bench/investigations/tpu_probe.py --out $OUT/probe.json   # the chip
    PYTHONPATH=src python3 bench/investigations/tpu_probe.py --tiny                  # CPU rehearsal

Prints one JSON document (and writes it with --out).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402 — it imports tierax, found through src


def facts() -> dict:
    return {
        "dev_accel": glob.glob("/dev/accel*"),
        "dev_vfio": glob.glob("/dev/vfio/*"),
        "tpu_env": sorted(k for k in os.environ if k.startswith("TPU")),
        "jax_platforms": os.environ.get("JAX_PLATFORMS"),
    }


def analysis_fields(compiled) -> dict:
    m = compiled.memory_analysis()
    return {k: getattr(m, k) for k in dir(m) if k.endswith("_in_bytes")}


def back_to_back(fn, args, calls: int) -> float:
    from tierax.measure.accel_rates import back_to_back as timed

    return timed(fn, args, calls)


def gemms(tiny: bool) -> list:
    import jax
    import jax.numpy as jnp

    tok = 512 if tiny else 16384
    shapes = (
        [(tok, 256, 256)]
        if tiny
        else [
            (8192, 8192, 8192),
            (tok, 2048, 2048),
            (tok, 2048, 8192),
            (tok, 8192, 2048),
            (tok, 2048, 32000),
            (tok, 2048, 1024),
            (tok, 2048, 128),
            (512, 2048, 8192),
        ]
    )
    out = []
    for m, k, n in shapes:
        a = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
        b = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
        f = jax.jit(lambda x, y: x @ y)
        t = back_to_back(f, (a, b), 5 if tiny else 20)
        out.append({"shape": [m, k, n], "s": t, "tflops": 2 * m * k * n / t / 1e12})
    return out


def host_copies(tiny: bool) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    dev = jax.devices()[0]
    host = SingleDeviceSharding(dev, memory_kind="pinned_host")
    devm = SingleDeviceSharding(dev, memory_kind="device")
    n = (1 << 20) if tiny else (1 << 29)  # bf16 elements: 1 GiB on the chip
    x = jax.random.normal(jax.random.key(0), (n // 4096, 4096), jnp.bfloat16)
    out: dict = {"bytes": n * 2}
    d2h = jax.jit(lambda v: v * 1, out_shardings=host)
    h = d2h(x)
    out["d2h_s"] = back_to_back(d2h, (x,), 3)
    h2d = jax.jit(lambda v: v * 1, out_shardings=devm)
    out["h2d_s"] = back_to_back(h2d, (h,), 3)
    mm = 1024 if tiny else 8192
    a = jax.random.normal(jax.random.key(2), (mm, mm), jnp.bfloat16)

    def chain(a, reps=4 if tiny else 24):
        def body(_, c):
            return (c @ a) * 0.01

        return jax.lax.fori_loop(0, reps, body, a)

    only = jax.jit(chain)
    both_d2h = jax.jit(lambda a, v: (chain(a), jax.device_put(v, host)))
    both_h2d = jax.jit(lambda a, v: (chain(a), jax.device_put(v, devm)))
    out["matmul_chain_s"] = back_to_back(only, (a,), 3)
    for name, f, arg in (("chain_with_d2h_s", both_d2h, x), ("chain_with_h2d_s", both_h2d, h)):
        try:
            out[name] = back_to_back(f, (a, arg), 3)
        except Exception as e:  # noqa: BLE001 — a probe records what fails
            out[name] = f"{type(e).__name__}: {str(e)[:300]}"
    out["memory_kind_h"] = str(h.sharding.memory_kind)
    return out


def steps(tiny: bool) -> list:
    import jax

    from tierax import plan as plan_lib
    from tierax.models import apply_overrides, get_config
    from tierax.train import step as step_lib

    over = [
        "d_model=2048",
        "num_layers=8",
        "mlp_dim=8192",
        "num_heads=16",
        "num_kv_heads=8",
        "head_dim=128",
        "vocab_size=32000",
        "dtype=bfloat16",
    ]
    cfg = get_config("tiny-llama")
    if not tiny:
        cfg = apply_overrides(cfg, over)
    from tierax import launch

    cfg = launch.local_attention(cfg)
    mb, seq = (2, 128) if tiny else (8, 2048)
    opt = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    tokens = step_lib.synthetic_batch(cfg, mb, seq)
    out = []
    import dataclasses

    base = plan_lib.preset("remat-full", cfg)
    host = plan_lib.StatePlacement(moments="offload", master_weights="offload")
    state_plan = dataclasses.replace(
        base, name="remat-full+state-host", state={g: host for g in base.groups}
    )
    plans = [plan_lib.preset("remat-full", cfg), plan_lib.preset("qkv-offload", cfg)]
    for p in plans + ([state_plan] if state_plan else []):
        rec: dict = {"plan": p.name, "microbatch": mb}
        try:
            graphdef, state = step_lib.init_state(cfg, opt, plan=p)
            fn = step_lib.make_train_step(
                graphdef, cfg, p, opt, step_lib.shardings_of(state) if p.offloads_state else None
            )
            t = time.perf_counter()
            compiled = fn.lower(state, tokens).compile()
            rec["compile_s"] = time.perf_counter() - t
            rec["analysis"] = analysis_fields(compiled)
            rec["stats_before"] = jax.devices()[0].memory_stats()
            box = {"s": state}

            def one(box=box, compiled=compiled):
                box["s"], m = compiled(box["s"], tokens)
                return m["loss"]

            one()
            jax.block_until_ready(box["s"])
            times = []
            for _ in range(3):
                t = time.perf_counter()
                jax.block_until_ready(one())
                times.append(time.perf_counter() - t)
            rec["step_s"] = times
            rec["stats_after"] = jax.devices()[0].memory_stats()
            box = state = compiled = None  # the next plan gets the memory
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
        out.append(rec)
    return out


def splash(tiny: bool) -> list:
    import jax
    import jax.numpy as jnp

    from tierax.models import attention

    out = []
    if jax.default_backend() != "tpu":
        return [{"skipped": "no TPU"}]
    for seq, d in ((2048, 128), (8192, 128), (2048, 64)):
        B, K, G = 4 if seq == 2048 else 1, 8, 2
        q = jax.random.normal(jax.random.key(0), (B, seq, K, G, d), jnp.bfloat16)
        k = jax.random.normal(jax.random.key(1), (B, seq, K, d), jnp.bfloat16)
        v = jax.random.normal(jax.random.key(2), (B, seq, K, d), jnp.bfloat16)
        fwd = jax.jit(lambda q, k, v: attention.splash_attention(q, k, v))

        def loss(q, k, v):
            return jnp.sum(attention.splash_attention(q, k, v).astype(jnp.float32))

        both = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        rec = {"B": B, "seq": seq, "heads": K * G, "head_dim": d}
        try:
            rec["fwd_s"] = back_to_back(fwd, (q, k, v), 10)
            rec["fwd_bwd_s"] = back_to_back(both, (q, k, v), 10)
            causal = 4 * B * seq * seq * K * G * d / 2
            rec["fwd_tflops_causal"] = causal / rec["fwd_s"] / 1e12
            rec["bwd_tflops_causal"] = 2.5 * causal / (rec["fwd_bwd_s"] - rec["fwd_s"]) / 1e12
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        out.append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the CPU rehearsal at toy sizes")
    ap.add_argument("--out", type=_common.out_path, help="also write the JSON document here")
    args = ap.parse_args()
    doc: dict = {"facts": facts()}
    import jax

    if args.tiny:
        jax.config.update("jax_platforms", "cpu")
    doc["backend"] = jax.default_backend()
    doc["device_kind"] = jax.devices()[0].device_kind
    doc["jax"] = jax.__version__
    for name, fn in (
        ("gemms", gemms),
        ("host_copies", host_copies),
        ("splash", splash),
        ("steps", steps),
    ):
        t = time.perf_counter()
        try:
            doc[name] = fn(args.tiny)
        except Exception:  # noqa: BLE001
            doc[name] = {"error": traceback.format_exc()[-2000:]}
        doc[f"{name}_wall_s"] = time.perf_counter() - t
        print(name, json.dumps(doc[name])[:3000], flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
