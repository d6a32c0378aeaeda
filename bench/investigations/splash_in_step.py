#!/usr/bin/env python3
"""The splash attention kernel's rate inside a training step on the v5e chip against the rate the
microbenchmark measured for it (the cost model's TPU splash rates).

Question: inside a real training step on the chip, do the splash kernels run at the rates the
microbenchmark measured (bench/results/tpu_kernel_rates.json, the cost model's v5e splash table)?
Answered: no, faster, in every profile (no ratio within 5 %): the step's forward kernels run
1.34-1.41 × the table's rate at head dim 128 and 1.19-1.22 × at head dim 64, the backward (dq +
dkv) 1.16-1.28 × and 1.09-1.12 ×.  The microbenchmark's own calls profiled on the chip
(bench/results/chip/splash_microbenchmark_ops.json) say why: its wall clock takes in the wrapper's
XLA ops around the kernel (the q scaling, the [B,S,H,d]↔[B,H,S,d] copies: 0.67 ms of its 2.46 ms
forward call at head dim 128), and its kernel alone runs at 98 / 92 TFLOP/s forward / backward
where the table holds 68 / 73.  Against the kernel alone the step's kernels run at 0.92-1.01 ×.
The cost model's rates are left as they are; the record states the recommendation.
Records: bench/results/splash_in_step.json, bench/results/chip/splash_microbenchmark_ops.json
Docs: docs/concepts/cost-model.md

Read from the chip's op profiles (``bench/results/chip/profiles/*_ops.json``, written by
``bench/investigations/chip_op_profile.py`` from ``tierax profile`` traces): each splash kernel's
device ms per step and executions per step. Forward: every ``splash_mha_fwd_*`` kernel (once in the
forward pass, once more recomputed in the backward where the plan rematerializes attention);
backward: ``splash_mha_dq_*`` plus ``splash_mha_dkv_*``. FLOPs per execution are the
microbenchmark's own count (:func:`tierax.measure.accel_rates._stand_in_flops`: the splash
stand-in's matmuls, causal at the kernel's 512 blocks, v padded to the q/k head dim as the kernel
runs it), at the case's shape read from its model config (``tierax.models``) and checked against the
kernels' operand shapes in the profile; the backward's FLOPs are 2.5 × the forward's, as the
microbenchmark and the cost model count them (``FUSED_BACKWARD_FLOPS_RATIO``). The microbenchmark's
rate at the case's (seq, head dim) is what the cost model prices the program at:
:func:`tierax.costmodel.rates.for_program` on the v5e target's default rates (no calibration file).
The dense_planned, dense_qkv and moe_* profiles predate the permutation form of RoPE
(bench/investigations/rope_forms.py); the splash kernels' operands and the kernels are the same
(their rows say ``before_rope_change``).

    python bench/investigations/splash_in_step.py [--out bench/results/splash_in_step.json]
    python bench/investigations/splash_in_step.py --probe-out OUT.json   # on the chip: the probe
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402 — the record envelope
import tpu_check  # noqa: E402 — the chip check's cases


def _case_overrides(name: str) -> list[str]:
    """The model overrides of the chip check's case ``name`` (the shape its profiles ran)."""
    return list(next(c for c in (*tpu_check.CASES, *tpu_check.EXTRA_CASES) if c[0] == name)[2])


SCHEMA = "tierax.splash-in-step/1"
PROFILES = "bench/results/chip/profiles"
# The microbenchmark's own calls profiled on the chip (probe_microbenchmark).
PROBE = "bench/results/chip/splash_microbenchmark_ops.json"
TARGET = "v5e"
# Within this share of 1 the in-step rate "is" the microbenchmark's.
TOLERANCE = 0.05
_DENSE = [
    "d_model=2048",
    "num_layers=8",
    "mlp_dim=8192",
    "vocab_size=32000",
    "dtype=bfloat16",
    "attention=auto",
]
_DENSE_128 = [*_DENSE, "num_heads=16", "num_kv_heads=8", "head_dim=128"]
_MOE = _case_overrides("moe")
_MLA_MOE = _case_overrides("mla-moe")
# Profiles written before tierax's models took the permutation form of RoPE on a TPU
# (bench/investigations/rope_forms.py): the splash kernels' inputs have the same shapes and the
# kernels are the same; only the RoPE fusions around them differ.
BEFORE_ROPE_CHANGE = ("dense_planned", "dense_qkv", "moe_minimal", "moe_remat_full")
# (profile, base model, overrides, microbatch, seq, plan, where the shape is stated)
CASES = (
    ("dense_planned", "tiny-llama", _DENSE_128, 8, 2048, "planned_mb8_mlpwi1", "the ops record"),
    ("dense_qkv", "tiny-llama", _DENSE_128, 8, 2048, "qkv-offload", "the ops record"),
    ("dense_remat_full", "tiny-llama", _DENSE_128, 8, 2048, "remat-full", "tpu_check's dense"),
    (
        "hd64_planned",
        "tiny-llama",
        [*_DENSE, "num_heads=32", "num_kv_heads=16", "head_dim=64"],
        8,
        2048,
        "planned_hd64_mb8",
        "hd64_planned_profile.json",
    ),
    (
        "hd64_qkv",
        "tiny-llama",
        [*_DENSE, "num_heads=32", "num_kv_heads=16", "head_dim=64"],
        8,
        2048,
        "qkv-offload",
        "hd64_qkv_profile.json",
    ),
    (
        "hd64_remat_full",
        "tiny-llama",
        [*_DENSE, "num_heads=32", "num_kv_heads=8", "head_dim=64"],
        8,
        2048,
        "remat-full",
        "tpu_check's dense-hd64 (8 kv heads: the kernels' operands say so)",
    ),
    ("moe_minimal", "tiny-mixtral", _MOE, 8, 2048, "minimal", "the ops record"),
    ("moe_remat_full", "tiny-mixtral", _MOE, 8, 2048, "remat-full", "the ops record"),
    (
        "mlamoe_deepseek_mb16",
        "tiny-deepseek",
        _MLA_MOE,
        16,
        2048,
        "deepseek-offload",
        "tpu_check's mla-moe",
    ),
)
_FWD, _DQ, _DKV = "splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"
_BF16 = re.compile(r"bf16\[([\d,]+)\]")


def splash_ops(path: pathlib.Path) -> list[dict]:
    """The splash kernels of an op profile's ``XLA Ops`` line: name, ms per step, executions per
    step and the first bf16 shape the kernel returns ([batch, heads, seq, head dim])."""
    doc = json.loads(path.read_text())
    out = []
    for line in doc["lines"]:
        if line.get("thread") != "XLA Ops":
            continue
        for op in line["ops"]:
            if op["name"].startswith("splash_mha_"):
                m = _BF16.search(op["args"]["long_name"])
                out.append(
                    {
                        "name": op["name"],
                        "ms_per_step": op["ms_per_step"],
                        "count": op["count"],
                        "returns": [int(x) for x in m.group(1).split(",")] if m else None,
                    }
                )
    return out


def attention_shape(base: str, overrides: list) -> dict:
    """Query heads, kv heads, q/k and v head dims of the model ``base`` with ``overrides``."""
    from tierax.models import apply_overrides, get_config

    cfg = apply_overrides(get_config(base), overrides)
    heads, dqk, dv = cfg.attention_dims()
    kv = getattr(cfg, "num_kv_heads", None) or heads  # MLA: one kv head per query head
    return {"heads": heads, "kv_heads": kv, "qk_head_dim": dqk, "v_head_dim": dv}


def forward_flops(microbatch: int, seq: int, shape: dict) -> float:
    """The forward FLOPs of one splash call as the microbenchmark and the cost model count them
    (:func:`tierax.measure.accel_rates._stand_in_flops`), on abstract operands of the shape."""
    import jax
    import jax.numpy as jnp

    from tierax.measure.accel_rates import _stand_in_flops

    k, g = shape["kv_heads"], shape["heads"] // shape["kv_heads"]
    d, dv = shape["qk_head_dim"], shape["v_head_dim"]
    sds = jax.ShapeDtypeStruct
    return _stand_in_flops(
        sds((microbatch, seq, k, g, d), jnp.bfloat16),
        sds((microbatch, seq, k, d), jnp.bfloat16),
        sds((microbatch, seq, k, dv), jnp.bfloat16),
    )


def microbenchmark_rates(seq: int, shape: dict) -> tuple[float, float]:
    """(forward, backward) FLOP/s the cost model prices the splash kernel at for a program of
    ``seq`` and the shape's q/k head dim on the v5e target (no calibration file)."""
    from tierax.costmodel import rates as rates_lib
    from tierax.tracing.program import FusedAttention

    r = rates_lib.target_rates(TARGET, "bfloat16", calibration={})
    prog = types.SimpleNamespace(
        seq=seq, attention=FusedAttention("splash", shape["heads"], shape["qk_head_dim"])
    )
    at = rates_lib.for_program(r, prog)
    return at.fused_attention_fwd_flops_per_s, at.fused_attention_bwd_flops_per_s


def case_row(case: tuple, root: pathlib.Path = ROOT, alone: list | None = None) -> dict:
    """One profile's splash kernels: FLOPs, in-step and microbenchmark rates, their ratios; with
    ``alone`` (:func:`kernel_alone`) also against the microbenchmark's kernel alone at the same
    (seq, head dim), where it was profiled."""
    from tierax.costmodel.rates import FUSED_BACKWARD_FLOPS_RATIO

    name, base, overrides, mb, seq, plan, shape_from = case
    shape = attention_shape(base, overrides)
    ops = splash_ops(root / PROFILES / f"{name}_ops.json")
    kernel_d = max(shape["qk_head_dim"], shape["v_head_dim"])  # v is padded to q/k's
    for op in ops:  # the kernels' own operands confirm the shape
        heads = shape["kv_heads"] if op["name"].startswith(_DKV) else shape["heads"]
        if op["returns"] != [mb, heads, seq, kernel_d]:
            raise SystemExit(f"{name}: {op['name']} returns {op['returns']}, not {shape}")
    flops = forward_flops(mb, seq, shape)
    fwd = [o for o in ops if o["name"].startswith(_FWD)]
    dq = [o for o in ops if o["name"].startswith(_DQ)]
    dkv = [o for o in ops if o["name"].startswith(_DKV)]
    n_fwd = sum(o["count"] for o in fwd)
    n_bwd = sum(o["count"] for o in dq)
    if n_bwd != sum(o["count"] for o in dkv):
        raise SystemExit(f"{name}: dq and dkv run a different number of times a step")
    fwd_s = sum(o["ms_per_step"] for o in fwd) / 1e3
    bwd_s = sum(o["ms_per_step"] for o in dq + dkv) / 1e3
    fwd_rate = n_fwd * flops / fwd_s
    bwd_rate = n_bwd * FUSED_BACKWARD_FLOPS_RATIO * flops / bwd_s
    micro_fwd, micro_bwd = microbenchmark_rates(seq, shape)
    priced_s = n_fwd * flops / micro_fwd + n_bwd * FUSED_BACKWARD_FLOPS_RATIO * flops / micro_bwd
    same = [a for a in alone or () if (a["seq"], a["head_dim"]) == (seq, shape["qk_head_dim"])]
    vs_alone = {}
    if same:
        vs_alone = {
            "fwd_ratio_kernel_alone": fwd_rate / same[0]["kernel_fwd_flops_per_s"],
            "bwd_ratio_kernel_alone": bwd_rate / same[0]["kernel_bwd_flops_per_s"],
        }
    return {
        "profile": f"{PROFILES}/{name}_ops.json",
        "model": base,
        "overrides": overrides,
        "microbatch": mb,
        "seq": seq,
        "plan": plan,
        "shape_from": shape_from,
        "before_rope_change": name in BEFORE_ROPE_CHANGE,
        **shape,
        "forward_flops_per_call": flops,
        "backward_flops_per_call": FUSED_BACKWARD_FLOPS_RATIO * flops,
        "kernels": ops,
        "forward_calls_per_step": n_fwd,
        "backward_calls_per_step": n_bwd,
        "forward_ms_per_step": fwd_s * 1e3,
        "backward_ms_per_step": bwd_s * 1e3,
        "in_step_fwd_flops_per_s": fwd_rate,
        "in_step_bwd_flops_per_s": bwd_rate,
        "microbenchmark_fwd_flops_per_s": micro_fwd,
        "microbenchmark_bwd_flops_per_s": micro_bwd,
        "fwd_ratio": fwd_rate / micro_fwd,
        "bwd_ratio": bwd_rate / micro_bwd,
        "kernel_ms_per_step": (fwd_s + bwd_s) * 1e3,
        "priced_ms_per_step": priced_s * 1e3,
        **vs_alone,
    }


def probe_microbenchmark(cases=((2048, 128), (2048, 64)), calls: int = 20) -> dict:
    """On the chip: the microbenchmark's calls (:func:`tierax.measure.accel_rates.splash_rates`'
    forward and gradient of the splash wrapper, batch 8, 16 heads over 8 kv heads) timed as it times
    them, then ``calls`` of each traced and every device op's time per call summed by name."""
    import collections
    import tempfile

    import jax
    import jax.numpy as jnp

    from tierax.measure import accel_rates
    from tierax.measure.trace import load_events
    from tierax.models import attention

    out = {}
    for seq, d in cases:
        b, k, g = 8, 8, 2
        ks = jax.random.split(jax.random.key(3), 3)
        q = jax.random.normal(ks[0], (b, seq, k, g, d), jnp.bfloat16)
        kk = jax.random.normal(ks[1], (b, seq, k, d), jnp.bfloat16)
        v = jax.random.normal(ks[2], (b, seq, k, d), jnp.bfloat16)
        fwd = jax.jit(lambda q, k, v: attention.splash_attention(q, k, v))

        def loss(q, k, v):
            return jnp.sum(attention.splash_attention(q, k, v).astype(jnp.float32))

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        for name, f in (("fwd", fwd), ("fwd_bwd", grad)):
            wall = accel_rates.back_to_back(f, (q, kk, v), calls)
            where = tempfile.mkdtemp()
            jax.profiler.start_trace(where, create_perfetto_trace=True)
            o = None
            for _ in range(calls):
                o = f(q, kk, v)
            jax.block_until_ready(o)
            jax.profiler.stop_trace()
            events, f_read = load_events(where)
            ops: dict = collections.defaultdict(float)
            for e in events:
                if "/device:" in e.process and e.thread == "XLA Ops":
                    ops[e.name] += e.dur_us / calls
            out[f"{seq}_{d}_{name}"] = {
                "calls": calls,
                "wall_ms_per_call": wall * 1e3,
                "device_ops_us_per_call": dict(ops),
                "trace": f_read.name,
            }
    return out


def kernel_alone(probe: dict) -> list[dict]:
    """The microbenchmark's cases from a probe record: FLOP/s over its wall clock (what the table
    holds) and over the splash kernels' own device time (forward: the forward kernel; backward:
    dq + dkv, against the wall clock's fwd+bwd less fwd)."""
    from tierax.costmodel.rates import FUSED_BACKWARD_FLOPS_RATIO

    out = []
    for key, f in probe["cases"].items():
        seq, d, what = key.split("_", 2)
        if what != "fwd":
            continue
        fb = probe["cases"][f"{seq}_{d}_fwd_bwd"]
        seq, d = int(seq), int(d)
        shape = {"heads": 16, "kv_heads": 8, "qk_head_dim": d, "v_head_dim": d}
        flops = forward_flops(8, seq, shape)

        def kernel_us(ops, prefixes):
            return sum(us for n, us in ops.items() if n.startswith(prefixes))

        k_fwd = kernel_us(f["device_ops_us_per_call"], (_FWD,)) / 1e6
        k_bwd = kernel_us(fb["device_ops_us_per_call"], (_DQ, _DKV)) / 1e6
        wall_f, wall_fb = f["wall_ms_per_call"] / 1e3, fb["wall_ms_per_call"] / 1e3
        bwd_flops = FUSED_BACKWARD_FLOPS_RATIO * flops
        out.append(
            {
                "seq": seq,
                "head_dim": d,
                "batch": 8,
                "heads": 16,
                "kv_heads": 8,
                "forward_flops_per_call": flops,
                "wall_fwd_flops_per_s": flops / wall_f,
                "wall_bwd_flops_per_s": bwd_flops / (wall_fb - wall_f),
                "kernel_fwd_flops_per_s": flops / k_fwd,
                "kernel_bwd_flops_per_s": bwd_flops / k_bwd,
                "other_ops_fwd_ms_per_call": sum(f["device_ops_us_per_call"].values()) / 1e3
                - k_fwd * 1e3,
            }
        )
    return out


def summary(rows: list[dict]) -> dict:
    """The ratios' range by head dim and the conclusion."""
    ratios = [r[k] for r in rows for k in ("fwd_ratio", "bwd_ratio")]
    by_dim = {}
    for d in sorted({r["qk_head_dim"] for r in rows}):
        at = [r for r in rows if r["qk_head_dim"] == d]
        by_dim[str(d)] = {
            k: [min(r[k] for r in at), max(r[k] for r in at)] for k in ("fwd_ratio", "bwd_ratio")
        }
    keys = ("fwd_ratio_kernel_alone", "bwd_ratio_kernel_alone")
    alone = [r[k] for r in rows for k in keys if k in r]
    within = sum(abs(x - 1) <= TOLERANCE for x in ratios)
    return {
        "tolerance": TOLERANCE,
        "ratios_within_tolerance": within,
        "ratios": len(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "by_qk_head_dim": by_dim,
        "in_step_faster_everywhere": min(ratios) > 1 + TOLERANCE,
        "kernel_alone_ratio_range": [min(alone), max(alone)] if alone else None,
        "recommendation": (
            "the splash table prices the kernels slower than they run in a step, by the ratios "
            "above (the splash share of each step overpriced by priced_ms_per_step less "
            "kernel_ms_per_step): tierax.measure.accel_rates.splash_rates divides by its whole "
            "jitted call's wall clock, the wrapper's q scaling and layout copies included, where "
            "the step books those as other ops.  Measure the kernel alone (its device time in a "
            "profile, or operands already in the kernel's layout) and re-extract the table, after "
            "checking that the step's wrapper ops are priced elsewhere (the host trace's stand-in, "
            "splash_blockwise, holds no such copies).  Rates unchanged here."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__, "splash_in_step.json")
    ap.add_argument(
        "--probe-out",
        type=_common.out_path,
        help="on the chip: profile the microbenchmark's own calls into this record "
        f"(probe_microbenchmark; {PROBE}) and stop",
    )
    args = ap.parse_args(argv)
    if args.probe_out is not None:
        probe = _common.envelope("tierax.splash-microbenchmark-ops/1", argv, devices=True)
        return _common.finish(args.probe_out, probe | {"cases": probe_microbenchmark()})
    doc = _common.envelope(SCHEMA, argv)
    alone = kernel_alone(json.loads((ROOT / PROBE).read_text()))
    rows = [case_row(c, alone=alone) for c in CASES]
    doc |= {
        "target": TARGET,
        "rates_record": "bench/results/tpu_kernel_rates.json",
        "flops": "tierax.measure.accel_rates._stand_in_flops (the microbenchmark's count)",
        "microbenchmark_rate": "tierax.costmodel.rates.for_program on target_rates('v5e', "
        "'bfloat16', calibration={})",
        "probe_record": PROBE,
        "microbenchmark_kernel_alone": alone,
        "cases": rows,
        "summary": summary(rows),
    }
    for r in rows:
        print(
            f"{r['profile'].split('/')[-1]:34} d={r['qk_head_dim']:3} "
            f"fwd {r['in_step_fwd_flops_per_s'] / 1e12:5.1f}/"
            f"{r['microbenchmark_fwd_flops_per_s'] / 1e12:5.1f} = {r['fwd_ratio']:.3f}  "
            f"bwd {r['in_step_bwd_flops_per_s'] / 1e12:5.1f}/"
            f"{r['microbenchmark_bwd_flops_per_s'] / 1e12:5.1f} = {r['bwd_ratio']:.3f}  "
            f"kernels {r['kernel_ms_per_step']:.1f} ms, priced {r['priced_ms_per_step']:.1f} ms"
        )
    return _common.finish(args.out, doc)


if __name__ == "__main__":
    sys.exit(main())
