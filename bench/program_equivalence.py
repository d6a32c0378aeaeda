#!/usr/bin/env python3
"""The cost model's predictions over a battery of cases, written to a record, and two records
compared figure by figure: the acceptance check of a refactoring that must not change a number.

The battery: every named model under a few presets on GPU, TPU and CPU-free targets and meshes
(MoE, fp8, cuDNN attention with a tiled loss, gradient accumulation, offloaded training state),
the planner's plan for some of them, the published-runs rows (``bench/data/calibration_runs.yaml``
through :func:`tierax.calibration.prepare`, the one implementation ``published_runs.py`` uses),
the seed case's configurations, a mesh search and a model of the Python API.  Each case records
every figure of its prediction (the breakdown's numbers, the split, the planner's chosen plan).

    .venv/bin/python bench/program_equivalence.py \
        --out bench/results/program_equivalence_before.json
    .venv/bin/python bench/program_equivalence.py --out /tmp/after.json \
        --compare bench/results/program_equivalence_before.json
    .venv/bin/python bench/program_equivalence.py --diff A.json B.json   # compare two records only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time

import _common

from tierax import launch

REL = 1e-9  # "equal within rounding": relative difference of a float figure
SCHEMA = "tierax.program-equivalence/1"

# (label, model, overrides, target, microbatch, seq, mesh, presets, grad_accum, planner)
MODEL_CASES = (
    ("tiny-llama h100", "tiny-llama", {}, "h100", 2, 64, {}, ("save-all", "remat-full"), 1, True),
    (
        "tiny-llama h100 fsdp2 tp2",
        "tiny-llama",
        {},
        "h100",
        2,
        64,
        {"fsdp": 2, "tensor": 2},
        ("save-all", "qkv-offload"),
        1,
        True,
    ),
    (
        "tiny-deepseek h100 fsdp2 ep2",
        "tiny-deepseek",
        {},
        "h100",
        2,
        64,
        {"fsdp": 2, "expert": 2},
        ("save-all", "deepseek-offload"),
        1,
        True,
    ),
    (
        "tiny-mixtral v5p fsdp2",
        "tiny-mixtral",
        {},
        "v5p",
        2,
        64,
        {"fsdp": 2},
        ("save-all", "minimal"),
        1,
        True,
    ),
    (
        "llama3-8b h100 fsdp8",
        "llama3-8b",
        {"attention": "cudnn"},
        "h100",
        1,
        2048,
        {"fsdp": 8},
        ("remat-full", "minimal", "qkv-offload"),
        1,
        True,
    ),
    (
        "llama3-8b h100 fsdp8 fp8",
        "llama3-8b",
        {"attention": "cudnn", "quantization": "fp8"},
        "h100",
        1,
        2048,
        {"fsdp": 8},
        ("minimal",),
        1,
        False,
    ),
    (
        "llama3-8b h200 tiled accum2",
        "llama3-8b",
        {"attention": "cudnn", "loss_tiles": 4},
        "h200",
        2,
        2048,
        {"fsdp": 8},
        ("minimal", "qkv-offload"),
        2,
        True,
    ),
    (
        "llama3-8b v5p fsdp8",
        "llama3-8b",
        {"attention": "splash"},
        "v5p",
        1,
        4096,
        {"fsdp": 8},
        ("remat-full", "save-all"),
        1,
        True,
    ),
    (
        "llama3-8b v5p fsdp4 tiled",
        "llama3-8b",
        {"attention": "splash", "loss_tiles": 4},
        "v5p",
        1,
        4096,
        {"fsdp": 4},
        ("minimal",),
        1,
        False,
    ),
    (
        "llama2-7b h100 fsdp8",
        "llama2-7b",
        {"attention": "blockwise"},
        "h100",
        1,
        4096,
        {"fsdp": 8},
        ("minimal",),
        1,
        False,
    ),
    (
        "llama2-70b h200 fsdp64",
        "llama2-70b",
        {"attention": "cudnn"},
        "h200",
        1,
        4096,
        {"fsdp": 64},
        ("remat-full", "qkv-offload"),
        1,
        True,
    ),
    (
        "llama3-70b b200 fsdp16 tp4",
        "llama3-70b",
        {"attention": "cudnn"},
        "b200",
        1,
        4096,
        {"fsdp": 16, "tensor": 4},
        ("minimal",),
        1,
        False,
    ),
    (
        "llama3.1-8b gb200 data2 fsdp4",
        "llama3.1-8b",
        {"attention": "cudnn"},
        "gb200",
        2,
        4096,
        {"data": 2, "fsdp": 4},
        ("minimal",),
        4,
        False,
    ),
    (
        "llama3.1-70b v6e fsdp32",
        "llama3.1-70b",
        {"attention": "splash"},
        "v6e",
        1,
        4096,
        {"fsdp": 32},
        ("remat-full",),
        1,
        False,
    ),
    (
        "mixtral-8x7b h100 fsdp8 ep8",
        "mixtral-8x7b",
        {"attention": "cudnn"},
        "h100",
        1,
        4096,
        {"fsdp": 8, "expert": 8},
        ("remat-full", "minimal"),
        1,
        True,
    ),
    (
        "deepseek-v3 ragged h200",
        "deepseek-v3-671b",
        {"attention": "cudnn", "moe_impl": "ragged"},
        "h200",
        1,
        4096,
        {"fsdp": 8, "expert": 8},
        ("minimal",),
        1,
        False,
    ),
    (
        "llama3.1-405b gb200 fsdp128",
        "llama3.1-405b",
        {"attention": "cudnn", "loss_tiles": 16},
        "gb200",
        2,
        8192,
        {"fsdp": 128},
        ("remat-full", "qkv-offload"),
        1,
        False,
    ),
    (
        "deepseek-v3 gb200 fsdp16 ep8",
        "deepseek-v3-671b",
        {"attention": "cudnn", "loss_tiles": 16},
        "gb200",
        2,
        4096,
        {"fsdp": 16, "expert": 8},
        ("remat-full", "deepseek-offload"),
        1,
        False,
    ),
)
# Training-state placements priced on some cases: (label suffix, state dict, grad_accum).
STATE_CASES = (
    ("moments offloaded", {"moments": "offload"}, 1),
    ("masters+moments offloaded", {"moments": "offload", "master_weights": "offload"}, 1),
    ("accum offloaded", {"grad_accum": "offload"}, 3),
)
STATE_ON = ("llama3-8b h100 fsdp8", "tiny-deepseek h100 fsdp2 ep2", "llama3-8b v5p fsdp8")
SCHEDULES = ("serial", "lhs", "lhs-pipelined")


def _flat(value, prefix="") -> dict:
    """Every number, bool and string of a nested JSON value by its dotted path."""
    out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out |= _flat(v, f"{prefix}{k}.")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out |= _flat(v, f"{prefix}{i}.")
    else:
        out[prefix.rstrip(".")] = value
    return out


def _pred_json(pred) -> dict:
    return json.loads(json.dumps(pred.to_json(), default=str))


class Api:
    """The cost model's entry points as this checkout spells them (before and after the refactor:
    the record is written by both)."""

    def __init__(self):
        from tierax import costmodel as cm
        from tierax.solving import planner
        from tierax.tracing import inventory as inv_lib

        self.cm, self.planner, self.inv_lib = cm, planner, inv_lib
        try:
            from tierax.tracing import model_program
        except ImportError:
            model_program = None
        self.mp = model_program

    def program(self, cfg, microbatch, seq, mesh):
        if self.mp is not None:
            return self.mp.program_of(cfg, microbatch, seq, mesh)
        return (cfg, self.inv_lib.model_inventory(cfg, microbatch, seq, mesh))

    def simulate(self, plan, prog, rates, schedule, grad_accum=1):
        if self.mp is not None:
            return self.cm.simulate(plan, prog, rates, schedule, grad_accum)
        cfg, inv = prog
        return self.cm.simulate(plan, inv, cfg, rates, schedule, grad_accum)

    def plan(self, prog, rates, **kw):
        if self.mp is not None:
            return self.planner.plan(prog, rates=rates, **kw)
        cfg, inv = prog
        return self.planner.plan(cfg, inv, rates, **kw)


def model_cases(api, only: set | None) -> dict:
    from tierax import costmodel as cm
    from tierax import plan as P
    from tierax.errors import TieraxError
    from tierax.models import apply_overrides, get_config

    out = {}
    for label, model, over, target, mb, seq, mesh, presets, accum, plan_it in MODEL_CASES:
        if only and label not in only:
            continue
        t0 = time.time()
        cfg = get_config(model)
        cfg = apply_overrides(cfg, [f"{k}={v}" for k, v in over.items()])
        mesh = {"data": 1, "fsdp": 1, **mesh}
        prog = api.program(cfg, mb, seq, mesh)
        rates = cm.target_rates(target, cfg.dtype)
        for preset in presets:
            plan = P.preset(preset, cfg)
            for schedule in SCHEDULES:
                key = f"model | {label} | {preset} | {schedule} | accum {accum}"
                out[key] = _pred_json(api.simulate(plan, prog, rates, schedule, accum))
        if label in STATE_ON:
            for what, state, a in STATE_CASES:
                d = P.preset("minimal", cfg).to_dict()
                d["state"] = {g.name: state for g in cfg.layer_groups()}
                plan = P.Plan.from_dict(d)
                key = f"state | {label} | {what} | lhs | accum {a}"
                try:
                    out[key] = _pred_json(api.simulate(plan, prog, rates, "lhs", a))
                except TieraxError as e:
                    out[key] = {"error": str(e)}
        if plan_it:
            for schedule in ("serial", "lhs"):
                key = f"planner | {label} | {schedule} | accum {accum}"
                try:
                    r = api.plan(prog, rates, schedule=schedule, grad_accum=accum, name="p")
                    out[key] = {"plan": r.plan.to_dict(), "predicted": _pred_json(r.predicted)}
                except TieraxError as e:
                    out[key] = {"error": str(e)}
        print(f"  {label}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def published_cases(api) -> dict:
    from tierax.calibration import load_runs, prepare

    out = {}
    runs = load_runs(_common.ROOT / "bench" / "data" / "calibration_runs.yaml")
    for run in runs:
        t0 = time.time()
        p = prepare(run)
        out[f"published | {run.name}"] = _pred_json(p.predict())
        print(f"  {run.name}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def seed_cases(api) -> dict:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import seed_case

    from tierax import costmodel as cm
    from tierax import plan as P
    from tierax.errors import TieraxError
    from tierax.mesh import parse_mesh
    from tierax.models import get_config

    rates = cm.target_rates("gb200", "bfloat16")
    out = {}
    for label, model, mb, seq, mesh_text in seed_case.CASES:
        t0 = time.time()
        quant = "fp8" if label.endswith(" fp8") else ""
        cfg = dataclasses.replace(
            get_config(model), attention="cudnn", loss_tiles=16, quantization=quant
        )
        prog = api.program(cfg, mb, seq, parse_mesh(mesh_text, 128).to_dict())
        pub, _ = seed_case.published_policy(cfg)
        for schedule in seed_case.SCHEDULES:
            for kind, plan in (
                ("remat-full", P.preset("remat-full", cfg)),
                ("save-all", P.preset("save-all", cfg)),
                ("published", pub),
            ):
                key = f"seed | {label} | {kind} | {schedule}"
                out[key] = _pred_json(api.simulate(plan, prog, rates, schedule))
            key = f"seed | {label} | planner | {schedule}"
            try:
                r = api.plan(prog, rates, schedule=schedule, name="planner")
                out[key] = {"plan": r.plan.to_dict(), "predicted": _pred_json(r.predicted)}
            except TieraxError as e:
                out[key] = {"error": str(e)}
        print(f"  {label}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def mesh_search_cases(api) -> dict:
    from tierax import costmodel as cm
    from tierax.models import apply_overrides, get_config
    from tierax.solving import mesh_search

    out = {}
    cfg = apply_overrides(get_config("llama3-8b"), ["attention=cudnn"])
    rates = cm.target_rates("h100", cfg.dtype)
    s = mesh_search.search(cfg, 8, rates, global_batch=8, seq=2048, prune=False)
    doc = json.loads(json.dumps(mesh_search.to_json(s, [], 0.0), default=str))
    out["mesh_search | llama3-8b 8 h100 gb8"] = doc
    return out


def api_cases(api) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    import tierax.api as tapi

    def layer(x, p):
        h = checkpoint_name(x @ p["w"], "mlpwi_0")
        return x + checkpoint_name(jnp.tanh(h) @ p["v"], "mlpwo")

    def loss(params, x):
        def body(c, p):
            return jax.checkpoint(layer, prevent_cse=False)(c, p), None

        y, _ = jax.lax.scan(body, x, params)
        return jnp.mean(y**2)

    params = {
        "w": jax.ShapeDtypeStruct((4, 64, 256), jnp.float32),
        "v": jax.ShapeDtypeStruct((4, 256, 64), jnp.float32),
    }
    x = jax.ShapeDtypeStruct((8, 32, 64), jnp.float32)
    inv = tapi.inventory(loss, params, x)
    out = {}
    free = tapi.plan(inv).predicted.peak_device_bytes
    for label, kw in (
        ("free", {}),
        ("fsdp8", {"mesh": {"fsdp": 8}}),
        ("budget", {"budget": free - 2**20}),
        ("serial", {"schedule": "serial"}),
        ("extra bytes", {"extra_bytes": 2**20, "target": "gb200"}),
    ):
        planned = tapi.plan(inv, **kw)
        out[f"api | {label}"] = {
            "plan": planned.plan.to_dict(),
            "predicted": _pred_json(planned.predicted),
        }
    return out


def compare(before: dict, after: dict) -> int:
    """Print every differing figure side by side; returns the number of differences."""
    a_cases, b_cases = before["cases"], after["cases"]
    diffs, equal, figures = [], 0, 0
    for key in sorted(set(a_cases) | set(b_cases)):
        if key not in a_cases or key not in b_cases:
            diffs.append((key, "(case)", a_cases.get(key, "—"), b_cases.get(key, "—")))
            continue
        fa, fb = _flat(a_cases[key]), _flat(b_cases[key])
        case_equal = True
        for name in sorted(set(fa) | set(fb)):
            figures += 1
            va, vb = fa.get(name, "—"), fb.get(name, "—")
            same = va == vb
            if (
                not same
                and isinstance(va, (int, float))
                and isinstance(vb, (int, float))
                and not isinstance(va, bool)
                and not isinstance(vb, bool)
            ):
                same = math.isclose(va, vb, rel_tol=REL, abs_tol=1e-12)
            if not same:
                case_equal = False
                diffs.append((key, name, va, vb))
        equal += case_equal
    print(
        f"{len(set(a_cases) & set(b_cases))} cases in both ({len(a_cases)} before, "
        f"{len(b_cases)} after), {figures} figures compared, {equal} cases equal in every figure "
        f"(floats within {REL:g} relative)"
    )
    if diffs:
        print(f"{len(diffs)} differing figures:")
        width = max(len(f"{k} :: {n}") for k, n, *_ in diffs)
        for key, name, va, vb in diffs:
            print(f"  {f'{key} :: {name}':<{width}}  before {va!s:>24}  after {vb!s:>24}")
    else:
        print("every figure equal")
    return len(diffs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=_common.out_path, metavar="FILE.json")
    ap.add_argument("--compare", metavar="BEFORE.json", help="compare the new record with this")
    ap.add_argument(
        "--diff",
        nargs=2,
        metavar=("BEFORE.json", "AFTER.json"),
        help="compare two records and exit (nothing is predicted)",
    )
    ap.add_argument(
        "--only",
        metavar="PART[,PART...]",
        help="model,state,published,seed,mesh_search,api (default: all)",
    )
    args = ap.parse_args(argv)
    if args.diff:
        a, b = (json.loads(pathlib.Path(p).read_text()) for p in args.diff)
        compare(a, b)
        return 0
    if not args.out:
        ap.error("--out FILE.json is required (or --diff)")
    parts = set((args.only or "model,published,seed,mesh_search,api").split(","))
    launch.start()
    api = Api()
    doc = _common.envelope(SCHEMA, argv)
    cases: dict = {}
    for part, fn in (
        ("model", lambda: model_cases(api, None)),
        ("published", lambda: published_cases(api)),
        ("seed", lambda: seed_cases(api)),
        ("mesh_search", lambda: mesh_search_cases(api)),
        ("api", lambda: api_cases(api)),
    ):
        if part in parts:
            t0 = time.time()
            print(f"{part} ...", file=sys.stderr, flush=True)
            cases |= fn()
            print(f"{part}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    doc["cases"] = cases
    print(f"wrote {_common.write_record(args.out, doc)} ({len(cases)} cases)")
    if args.compare:
        compare(json.loads(pathlib.Path(args.compare).read_text()), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
