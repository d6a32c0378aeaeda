"""The ``tierax`` command line: one thin function per verb over the library.

Bad input exits 2 with a message naming the problem and the fix.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence

from tierax.errors import TieraxError


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # pipes and CI: wide enough for the bench table
        console = Console(width=160)
    return console


def cmd_models(args) -> int:
    from tierax.models import NAMED_CONFIGS
    from tierax.report.tables import models_table

    if args.json:
        print(json.dumps({n: {"family": c.family, "param_count": c.param_count(),
                              "activated_param_count": c.activated_param_count()}
                          for n, c in NAMED_CONFIGS.items()}, indent=2))
    else:
        _console().print(models_table(NAMED_CONFIGS.values()))
    return 0


def cmd_plans(args) -> int:
    from tierax import plan as plan_lib
    from tierax.models import get_config
    from tierax.report.tables import plan_table

    cfg = get_config(args.model)
    if args.show is None:
        for name, (desc, _) in plan_lib.PRESETS.items():
            print(f"{name:18s} {desc}")
        return 0
    plan = plan_lib.load_plan(args.show, cfg)
    if args.yaml:
        print(plan.to_yaml(), end="")
    else:
        _console().print(plan_table(plan_lib.resolve(plan, cfg), f"plan {plan.name} on {cfg.name}"))
    return 0


def _parse_mesh(text: str) -> dict[str, int]:
    axes = {"data": 1, "fsdp": 1}
    for part in filter(None, text.split(",")):
        key, sep, val = part.partition("=")
        if not sep or key not in axes or not val.isdigit() or int(val) < 1:
            raise TieraxError(f"--mesh {text!r}: expected comma-separated data=N,fsdp=N with N ≥ 1")
        axes[key] = int(val)
    return axes


def cmd_bench(args) -> int:
    from tierax import xla_flags

    mesh = _parse_mesh(args.mesh) if args.mesh else None
    devices = args.devices or (mesh["data"] * mesh["fsdp"] if mesh else None)
    xla_flags.configure(cpu_devices=devices, preset=args.xla_preset)

    import jax

    from tierax import bench
    from tierax import plan as plan_lib
    from tierax.fileio import write_text_atomic
    from tierax.models import get_config
    from tierax.report.tables import bench_table

    cfg = get_config(args.model)
    mesh = mesh or {"data": 1, "fsdp": jax.device_count()}
    plans = [plan_lib.load_plan(p.strip(), cfg) for p in args.plans.split(",") if p.strip()]
    if not plans:
        raise TieraxError("--plans is empty; give a comma-separated list of presets or plan files")
    if args.steps < 1:
        raise TieraxError(f"--steps must be ≥ 1, got {args.steps}")

    from rich.progress import Progress

    total = len(plans) + args.steps
    with Progress(transient=True, disable=args.json) as prog:
        task = prog.add_task(f"bench {cfg.name}", total=total)
        records, peak = bench.run_bench(
            cfg, plans, steps=args.steps, microbatch=args.microbatch, seq=args.seq,
            data=mesh["data"], fsdp=mesh["fsdp"],
            progress=lambda what, n: prog.update(task, advance=n, description=what),
        )
    command = "tierax " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    doc = bench.bench_document(cfg, records, peak, command=command, microbatch=args.microbatch,
                               seq=args.seq, steps=args.steps, mesh=mesh)
    if args.out:
        write_text_atomic(args.out, json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc["records"], indent=2))
    else:
        title = (f"{cfg.name} · microbatch {args.microbatch} × seq {args.seq} · {jax.device_count()} "
                 f"{jax.devices()[0].platform} device(s) · median of {args.steps} steps")
        _console().print(bench_table(records, peak, title))
        if jax.devices()[0].platform == "cpu":
            print("note: XLA:CPU ignores host offloading; offload plans run as their save-on-device twin here.")
        if args.out:
            print(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tierax",
        description="Schedule accelerator memory in JAX training: keep, offload or recompute each activation.",
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    m = sub.add_parser("models", help="list the named model configs", description="List the named model configs with parameter counts.")
    m.add_argument("--json", action="store_true", help="print JSON")
    m.set_defaults(func=cmd_models)

    pl = sub.add_parser("plans", help="list plan presets or show one", description="List the plan presets, or show one resolved for a model.")
    pl.add_argument("--model", default="tiny-llama", help="named model config (default: tiny-llama)")
    pl.add_argument("--show", metavar="PLAN", help="a preset name or plan YAML file to show")
    pl.add_argument("--yaml", action="store_true", help="print the plan as YAML (usable as a plan file)")
    pl.set_defaults(func=cmd_plans)

    b = sub.add_parser("bench", help="run plans side by side on the local devices",
                       description="Compile and time a train step under each plan on the local devices.")
    b.add_argument("--model", default="tiny-llama", help="named model config (default: tiny-llama)")
    b.add_argument("--plans", default="save-all,remat-full,minimal,qkv-offload",
                   help="comma-separated presets or plan YAML files")
    b.add_argument("--steps", type=int, default=10, help="timed steps per plan (default 10)")
    b.add_argument("--microbatch", type=int, default=8, help="sequences per step (default 8)")
    b.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    b.add_argument("--devices", type=int, help="host CPU devices to create (CPU backend only)")
    b.add_argument("--mesh", help="mesh axes, e.g. data=2,fsdp=4 (default: fsdp over all devices)")
    b.add_argument("--xla-preset", default="none", help="XLA flag preset: none, lhs, lhs-pipelined")
    b.add_argument("--json", action="store_true", help="print a JSON list of per-plan records")
    b.add_argument("--out", help="also write the full JSON record (machine, versions, command) to this file")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TieraxError as e:
        print(f"tierax {args.verb}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
