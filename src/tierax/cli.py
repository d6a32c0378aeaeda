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


def _add_set_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config field, e.g. --set d_model=512 (repeatable)")


def _add_model_args(parser: argparse.ArgumentParser, *, default: str | None = "tiny-llama") -> None:
    """``--model NAME``, ``--model-config FILE`` and repeated ``--set KEY=VALUE``.

    Every verb that takes a model uses this and ``_resolve_model``.  ``default`` is
    the named config used when neither ``--model`` nor ``--model-config`` is given
    (``None``: one of them is required).
    """
    suffix = f" (default: {default})" if default else ""
    parser.add_argument("--model", metavar="NAME", help=f"named model config, see `tierax models`{suffix}")
    parser.add_argument("--model-config", metavar="FILE",
                        help="model config YAML (family + fields, as `tierax models show NAME` prints)")
    _add_set_arg(parser)
    parser.set_defaults(model_default=default)


def _resolve_model(args, extra_overrides: Sequence[str] = ()):
    """The ModelConfig selected by ``_add_model_args`` options, overrides applied in order."""
    from tierax.models import NAMED_CONFIGS, apply_overrides, get_config, load_model_config

    if args.model is not None and args.model_config is not None:
        raise TieraxError(
            "--model and --model-config both given; use one: --model NAME for a named config "
            "or --model-config FILE for a config file"
        )
    if args.model_config is not None:
        cfg = load_model_config(args.model_config)
    elif args.model is not None or args.model_default:
        cfg = get_config(args.model if args.model is not None else args.model_default)
    else:
        raise TieraxError(
            f"no model given; use --model NAME ({', '.join(NAMED_CONFIGS)}) or --model-config FILE"
        )
    return apply_overrides(cfg, [*args.overrides, *extra_overrides])


def cmd_models(args) -> int:
    from tierax.models import NAMED_CONFIGS, apply_overrides, config_to_dict, config_to_yaml, get_config
    from tierax.report.tables import models_table

    if args.action == "show":
        if args.name is None:
            raise TieraxError(f"models show needs a NAME; named configs: {', '.join(NAMED_CONFIGS)}")
        cfg = apply_overrides(get_config(args.name), args.overrides)
        if args.json:
            print(json.dumps(config_to_dict(cfg), indent=2))
        else:
            print(config_to_yaml(cfg), end="")
        return 0
    if args.name is not None or args.overrides:
        raise TieraxError("a NAME and --set apply only to `tierax models show NAME [--set KEY=VALUE ...]`")
    if args.json:
        print(json.dumps({n: {"family": c.family, "param_count": c.param_count(),
                              "activated_param_count": c.activated_param_count()}
                          for n, c in NAMED_CONFIGS.items()}, indent=2))
    else:
        _console().print(models_table(NAMED_CONFIGS.values()))
    return 0


def cmd_plans(args) -> int:
    from tierax import plan as plan_lib
    from tierax.report.tables import plan_table

    cfg = _resolve_model(args)
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
    """``data=N,fsdp=N[,tensor=1,expert=1]`` → axis sizes (data and fsdp are what tierax shards over)."""
    axes = {"data": 1, "fsdp": 1}
    for part in filter(None, text.split(",")):
        key, sep, val = part.partition("=")
        if not sep or key not in ("data", "fsdp", "tensor", "expert") or not val.isdigit() or int(val) < 1:
            raise TieraxError(
                f"--mesh {text!r}: expected comma-separated axis=N with axes data, fsdp (tensor, expert = 1) and N ≥ 1"
            )
        if key in ("tensor", "expert"):
            if int(val) != 1:
                raise TieraxError(
                    f"--mesh {key}={val}: tierax shards over data and fsdp only so far; use {key}=1 and put the "
                    "devices on fsdp"
                )
            continue
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
    from tierax.report.tables import bench_table

    cfg = _resolve_model(args, [f"dtype={args.dtype}"] if args.dtype else [])
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
        title = (f"{cfg.name} · microbatch {args.microbatch}/device × seq {args.seq} · {jax.device_count()} "
                 f"{jax.devices()[0].platform} device(s) · median of {args.steps} steps")
        _console().print(bench_table(records, peak, title))
        if jax.devices()[0].platform == "cpu":
            print("note: XLA:CPU ignores host offloading; offload plans run as their save-on-device twin here.")
        if args.out:
            print(f"wrote {args.out}")
    return 0


def cmd_compile(args) -> int:
    from tierax import xla_flags

    mesh = _parse_mesh(args.mesh) if args.mesh else {"data": 1, "fsdp": args.devices or 1}
    devices = args.devices or mesh["data"] * mesh["fsdp"]
    if mesh["data"] * mesh["fsdp"] != devices:
        raise TieraxError(
            f"--mesh {args.mesh} has {mesh['data'] * mesh['fsdp']} devices but --devices is {devices}; "
            "make the mesh product equal the device count"
        )
    # Deviceless GPU compilation: the host platform only, flags set before the backend starts.
    xla_flags.configure(preset=args.xla_preset, deviceless_gpu=True)

    from tierax import compile as compile_lib
    from tierax import hardware
    from tierax import plan as plan_lib
    from tierax.report.tables import compile_table

    hardware.get_target(args.target)
    compile_lib.check_gpu_aot()
    cfg = _resolve_model(args)
    plan = plan_lib.load_plan(args.plan, cfg)
    target_config = None
    if args.target_config:
        import pathlib

        path = pathlib.Path(args.target_config)
        if not path.is_file():
            raise TieraxError(f"--target-config {args.target_config!r}: no such file")
        target_config = path.read_text()
    result, _ = compile_lib.compile_for_target(
        cfg, plan, args.target, microbatch=args.microbatch, seq=args.seq, data=mesh["data"], fsdp=mesh["fsdp"],
        xla_preset=args.xla_preset, target_config=target_config,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _console().print(compile_table(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tierax",
        description="Schedule accelerator memory in JAX training: keep, offload or recompute each activation.",
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    m = sub.add_parser("models", help="list the named model configs, or show one as YAML",
                       description="List the named model configs with parameter counts, or `show NAME`: "
                                   "print one (with --set overrides) as YAML that --model-config accepts.")
    m.add_argument("action", nargs="?", choices=["show"], help="show: print one config as a model config file")
    m.add_argument("name", nargs="?", metavar="NAME", help="the named config to show")
    m.add_argument("--json", action="store_true", help="print JSON")
    _add_set_arg(m)
    m.set_defaults(func=cmd_models)

    pl = sub.add_parser("plans", help="list plan presets or show one", description="List the plan presets, or show one resolved for a model.")
    _add_model_args(pl)
    pl.add_argument("--show", metavar="PLAN", help="a preset name or plan YAML file to show")
    pl.add_argument("--yaml", action="store_true", help="print the plan as YAML (usable as a plan file)")
    pl.set_defaults(func=cmd_plans)

    b = sub.add_parser("bench", help="run plans side by side on the local devices",
                       description="Compile and time a train step under each plan on the local devices.")
    _add_model_args(b)
    b.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="activation/compute dtype (an override of `dtype`; param_dtype is kept)")
    b.add_argument("--plans", default="save-all,remat-full,minimal,qkv-offload",
                   help="comma-separated presets or plan YAML files")
    b.add_argument("--steps", type=int, default=10, help="timed steps per plan (default 10)")
    b.add_argument("--microbatch", type=int, default=8, help="sequences per device (default 8)")
    b.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    b.add_argument("--devices", type=int, help="host CPU devices to create (CPU backend only)")
    b.add_argument("--mesh", help="mesh axes, e.g. data=2,fsdp=4 (default: fsdp over all devices)")
    b.add_argument("--xla-preset", default="none", help="XLA flag preset: none, lhs, lhs-pipelined")
    b.add_argument("--json", action="store_true", help="print a JSON list of per-plan records")
    b.add_argument("--out", help="also write the full JSON record (machine, versions, command) to this file")
    b.set_defaults(func=cmd_bench)
    c = sub.add_parser(
        "compile", help="compile a plan for a GPU target without a GPU",
        description="Compile the full train step under a plan for a GPU target on this machine (deviceless XLA:GPU "
                    "compilation) and report XLA's memory figures and a static copy/compute overlap check.",
    )
    _add_model_args(c)
    c.add_argument("--plan", default="qkv-offload", help="a preset or plan YAML file (default: qkv-offload)")
    c.add_argument("--target", default="h200", help="h100, h200, b200 or gb200 (default: h200)")
    c.add_argument("--target-config", metavar="FILE", help="a GpuTargetConfigProto text file instead of the built-in one")
    c.add_argument("--devices", type=int, help="compile-only GPUs (default: the mesh's product, else 1)")
    c.add_argument("--mesh", help="mesh axes, e.g. fsdp=8 or data=2,fsdp=4 (tensor=1,expert=1 accepted)")
    c.add_argument("--microbatch", type=int, default=8, help="sequences per device (default 8)")
    c.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    c.add_argument("--xla-preset", default="none", help="XLA flag preset: none, lhs, lhs-pipelined")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_compile)
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
