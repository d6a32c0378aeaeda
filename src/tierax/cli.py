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
from tierax.mesh import parse_mesh


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


def cmd_bench(args) -> int:
    from tierax import xla_flags

    mesh = parse_mesh(args.mesh, args.devices) if args.mesh else None
    if mesh is not None:
        mesh.require_step_axes("--mesh")
    xla_flags.configure(cpu_devices=args.devices or (mesh.size if mesh else None), preset=args.xla_preset)

    import jax

    from tierax import bench
    from tierax import plan as plan_lib
    from tierax.fileio import write_text_atomic
    from tierax.report.tables import bench_table

    cfg = _resolve_model(args, [f"dtype={args.dtype}"] if args.dtype else [])
    mesh = mesh or parse_mesh(None, jax.device_count())
    plans = [plan_lib.load_plan(p.strip(), cfg) for p in args.plans.split(",") if p.strip()]
    if not plans:
        raise TieraxError("--plans is empty; give a comma-separated list of presets or plan files")
    if args.steps < 1:
        raise TieraxError(f"--steps must be ≥ 1, got {args.steps}")
    verified = _verify_before_bench(cfg, plans, args) if args.verify else None
    if verified is not None and not all(v.passed for v in verified):
        return 1

    from rich.progress import Progress

    total = len(plans) + args.steps
    with Progress(transient=True, disable=args.json) as prog:
        task = prog.add_task(f"bench {cfg.name}", total=total)
        records, peak = bench.run_bench(
            cfg, plans, steps=args.steps, microbatch=args.microbatch, seq=args.seq,
            mesh=mesh,
            progress=lambda what, n: prog.update(task, advance=n, description=what),
        )
    command = "tierax " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    doc = bench.bench_document(cfg, records, peak, command=command, microbatch=args.microbatch,
                               seq=args.seq, steps=args.steps, mesh=mesh)
    if verified is not None:
        doc["verify"] = [v.to_json() for v in verified]
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

    mesh = parse_mesh(args.mesh, args.devices)
    mesh.require_step_axes("--mesh")
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
        cfg, plan, args.target, microbatch=args.microbatch, seq=args.seq, mesh=mesh,
        xla_preset=args.xla_preset, target_config=target_config,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _console().print(compile_table(result))
    return 0


def _planning_inputs(args):
    from tierax import costmodel as cm
    from tierax import inventory as inv_lib

    cfg = _resolve_model(args)
    mesh = parse_mesh(args.mesh, args.devices).to_dict()
    if args.microbatch < 1 or args.seq < 1:
        raise TieraxError("--microbatch and --seq must be ≥ 1")
    rates = cm.target_rates(args.target, cfg.dtype)
    return cfg, mesh, rates, (lambda mb: inv_lib.model_inventory(cfg, mb, args.seq, mesh))


def cmd_inventory(args) -> int:
    from tierax import xla_flags

    xla_flags.configure()
    from tierax.report.tables import inventory_table

    cfg = _resolve_model(args)
    mesh = parse_mesh(args.mesh, args.devices).to_dict()
    from tierax import inventory as inv_lib

    inv = inv_lib.model_inventory(cfg, args.microbatch, args.seq, mesh)
    if args.json:
        print(json.dumps(inv_lib.inventory_json(inv), indent=2))
    else:
        _console().print(inventory_table(inv, cfg))
    return 0


def cmd_simulate(args) -> int:
    from tierax import xla_flags

    xla_flags.configure()
    from tierax import costmodel as cm
    from tierax import plan as plan_lib
    from tierax.report.tables import prediction_table

    cfg, mesh, rates, inventory = _planning_inputs(args)
    plan = plan_lib.load_plan(args.plan, cfg)
    pred = cm.simulate(plan, inventory(args.microbatch), cfg, rates, args.schedule)
    if args.json:
        print(json.dumps(pred.to_json(), indent=2))
    else:
        _console().print(prediction_table(pred, f"{cfg.name} · plan {plan.name} · {args.target} · mesh {mesh} · "
                                                f"microbatch {args.microbatch}/device × seq {args.seq} · {args.schedule}"))
    return 0


def cmd_plan(args) -> int:
    from tierax import xla_flags

    xla_flags.configure()
    from tierax import planner
    from tierax.fileio import write_text_atomic
    from tierax.report.tables import explain_table, prediction_table

    cfg, mesh, rates, inventory = _planning_inputs(args)
    gib = 2**30
    budget = args.budget_gib * gib if args.budget_gib is not None else None
    host = args.host_budget_gib * gib if args.host_budget_gib is not None else None
    if args.max_microbatch:
        result = planner.max_microbatch(cfg, args.seq, mesh, rates, schedule=args.schedule, budget_bytes=budget,
                                        host_budget_bytes=host)
    else:
        result = planner.plan(cfg, inventory(args.microbatch), rates, schedule=args.schedule, budget_bytes=budget,
                              host_budget_bytes=host)
    if args.out:
        write_text_atomic(args.out, result.plan.to_yaml())
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        title = (f"{cfg.name} · {args.target} · mesh {mesh} · microbatch {result.microbatch}/device × seq {args.seq} · "
                 f"{args.schedule}")
        _console().print(explain_table(result, title))
        _console().print(prediction_table(result.predicted, "predicted step"))
        if args.out:
            print(f"wrote {args.out}")
    return 0


def cmd_calibrate(args) -> int:
    from tierax import xla_flags

    xla_flags.configure()
    from tierax import calibrate

    result = calibrate.run_and_save()
    print(json.dumps(result, indent=2))
    return 0


def _add_planning_parsers(sub) -> None:
    def common(p, *, target_default="h200"):
        _add_model_args(p)
        p.add_argument("--target", default=target_default, help="h100, h200, b200, gb200, or cpu (measured by calibrate)")
        p.add_argument("--devices", type=int, help="devices (default: the mesh's product, else 1)")
        p.add_argument("--mesh", help="mesh axes, e.g. fsdp=16,expert=8 (data, fsdp, tensor, expert)")
        p.add_argument("--microbatch", type=int, default=8, help="sequences per device (default 8)")
        p.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
        p.add_argument("--json", action="store_true", help="print one JSON object")

    i = sub.add_parser("inventory", help="the activations a plan places, from an abstract trace",
                       description="Per layer group and activation: bytes per layer per device, layers, recompute "
                                   "FLOPs; per device parameter, gradient and optimizer bytes. Nothing is allocated.")
    common(i)
    i.set_defaults(func=cmd_inventory)

    s = sub.add_parser("simulate", help="predict memory and step time of a plan on a target",
                       description="Predicted peak device bytes, host bytes and step time of a plan (cost model).")
    common(s)
    s.add_argument("--plan", default="qkv-offload", help="a preset or plan YAML file")
    s.add_argument("--schedule", default="lhs", help="serial, lhs or lhs-pipelined")
    s.set_defaults(func=cmd_simulate)

    p = sub.add_parser("plan", help="find the fastest plan that fits, and explain it",
                       description="Choose device/offload/remat per activation to minimise predicted step time within "
                                   "the device and host budgets (exact integer program, HiGHS).")
    common(p)
    p.add_argument("--schedule", default="lhs", help="serial, lhs or lhs-pipelined")
    p.add_argument("--budget-gib", type=float, help="device budget (default: capacity minus a 5%% reserve)")
    p.add_argument("--host-budget-gib", type=float, help="host budget per device (default: host memory per GPU)")
    p.add_argument("--max-microbatch", action="store_true", help="find the largest microbatch that fits, and its plan")
    p.add_argument("--out", help="write the plan as YAML (usable by bench, compile, simulate)")
    p.set_defaults(func=cmd_plan)

    c = sub.add_parser("calibrate", help="measure this machine's rates for the cost model",
                       description="Measure the local matmul rate (and host↔device copy bandwidth on a GPU) and store "
                                   "them for the cost model.")
    c.set_defaults(func=cmd_calibrate)


def _add_training_parsers(sub) -> None:
    t = sub.add_parser(
        "train", help="train a model under a plan from a config file",
        description="Train from a YAML config (see configs/demo-train.yaml; keys are listed in README.md) with "
                    "KEY=VALUE overrides (dotted for sections: mesh.fsdp=4, optimizer.lr=3e-4, model.d_model=128). "
                    "Writes metrics.jsonl, metrics.png and the resolved config to log.dir, Orbax checkpoints to "
                    "checkpoint.dir.",
    )
    t.add_argument("config", metavar="CONFIG.yaml", help="the train config file")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, applied in order")
    t.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in checkpoint.dir (none: start fresh)")
    t.add_argument("--verify", action="store_true",
                   help="first check the plan's gradients against save-all (tierax.measure.verify); stop if they differ")
    t.add_argument("--json", action="store_true", help="no progress display; print one JSON summary per process")
    t.add_argument("--coordinator", metavar="HOST:PORT", help="multi-process: process 0's address (env TIERAX_COORDINATOR)")
    t.add_argument("--num-processes", type=int, metavar="N", help="multi-process: process count (env TIERAX_NUM_PROCESSES)")
    t.add_argument("--process-id", type=int, metavar="I", help="multi-process: this process, 0-based (env TIERAX_PROCESS_ID)")
    t.set_defaults(func=cmd_train)

    d = sub.add_parser("data", help="prepare training data",
                       description="prepare TEXT_FILE --out DIR: tokenize a text file byte-level (vocabulary 256) into "
                                   "a memory-mapped token file plus index.json, for data.source: tokens.")
    d.add_argument("action", choices=["prepare"], help="prepare: tokenize a text file")
    d.add_argument("text_file", metavar="TEXT_FILE", help="a UTF-8 (or any byte) text file")
    d.add_argument("--out", required=True, metavar="DIR", help="the token directory to write")
    d.set_defaults(func=cmd_data)

    pm = sub.add_parser("plot-metrics", help="plot loss and throughput of a training run",
                        description="Draw loss and throughput (tokens/s, TFLOP/s/device) curves of RUN_DIR/metrics.jsonl "
                                    "to a PNG (default RUN_DIR/metrics.png).")
    pm.add_argument("run_dir", metavar="RUN_DIR", help="the log.dir of a `tierax train` run")
    pm.add_argument("--out", metavar="FILE.png", help="where to write the PNG")
    pm.set_defaults(func=cmd_plot_metrics)


def cmd_train(args) -> int:
    from tierax import xla_flags
    from tierax.train import config as train_config
    from tierax.train import loop

    # Everything below up to configure() reads files and validates; JAX's backend starts after it.
    cfg = train_config.load_train_config(args.config, args.overrides)
    dist = train_config.Distributed.resolve(args.coordinator, args.num_processes, args.process_id)
    nproc = dist.num_processes if dist else 1
    gpu = xla_flags.expects_gpu()
    env, env_lines = loop.runtime_env(cfg, gpu=gpu, num_processes=nproc)
    xla_flags.configure(cpu_devices=None if gpu else train_config.cpu_devices_per_process(cfg, nproc),
                        preset=cfg.xla_preset, cpu_collectives="gloo" if dist and not gpu else None, env=env)
    loop.initialize_distributed(dist)

    import jax

    main_process = jax.process_index() == 0
    console = _console()
    say = console.print if main_process and not args.json else (lambda *a, **k: None)
    for line in env_lines:
        say(line)
    if args.verify:
        say(loop.verify_before_training(cfg))
    reporter = loop.RichReporter(console, cfg.log.every) if not args.json else loop.Reporter()
    try:
        with loop.Trainer(cfg, resume=args.resume, reporter=reporter) as trainer:
            result = trainer.train()
    except loop.NonFiniteLoss as e:
        print(f"tierax train: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"process_index": jax.process_index(), "process_count": jax.process_count(),
                          "first_step": result.first_step, "last_step": result.last_step,
                          "losses": list(result.losses), "resumed_from": result.resumed_from,
                          "last_checkpoint": result.last_checkpoint, "compile_s": result.compile_s}))
    elif result.losses:
        say(f"trained steps {result.first_step}–{result.last_step}: loss {result.losses[0]:.4f} → "
            f"{result.losses[-1]:.4f}; metrics in {cfg.log.dir}/{loop.METRICS}"
            + (f"; last checkpoint step {result.last_checkpoint}" if result.last_checkpoint else ""))
    else:
        say(f"nothing to train: the run is already at step {result.first_step - 1} of {cfg.steps}")
    return 0


def cmd_data(args) -> int:
    from tierax.train import data

    index = data.prepare_text(args.text_file, args.out)
    print(f"wrote {index.num_tokens:,} tokens ({index.tokenizer} tokenizer, vocab {index.vocab_size}, "
          f"{index.dtype}) to {args.out}/{data.TOKENS} with {args.out}/{data.INDEX}")
    return 0


def cmd_plot_metrics(args) -> int:
    from tierax.train.plots import plot_metrics

    print(f"wrote {plot_metrics(args.run_dir, args.out)}")
    return 0


# --- measuring: verify, profile, report ---------------------------------------------


def _command_line() -> str:
    return "tierax " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _verify_before_bench(cfg, plans, args):
    """``bench --verify``: every plan's gradients against save-all; prints failures to stderr."""
    from tierax.measure import verify as verify_lib
    from tierax.report.measure_tables import verify_table

    results = verify_lib.verify_plans(cfg, plans, microbatch=args.microbatch, seq=args.seq)
    failed = [r for r in results if not r.passed]
    if failed:
        from rich.console import Console

        Console(stderr=True, width=160).print(verify_table(results, f"gradient check of {cfg.name} before bench"))
        print(f"tierax bench: gradients of {', '.join(r.plan for r in failed)} differ from save-all "
              f"(worst leaf {failed[0].worst_leaves[0].path}); no benchmark was run", file=sys.stderr)
    return results


def cmd_verify(args) -> int:
    from tierax import xla_flags

    xla_flags.configure(preset=args.xla_preset)

    import jax

    from tierax import plan as plan_lib
    from tierax.bench import machine_info
    from tierax.measure import verify as verify_lib
    from tierax.models import config_to_dict
    from tierax.report.measure_tables import verify_table

    cfg = _resolve_model(args)
    plans = [plan_lib.load_plan(p.strip(), cfg) for p in args.plan.split(",") if p.strip()]
    if not plans:
        raise TieraxError("--plan is empty; give a preset, a plan YAML file, or a comma-separated list of them")
    results = verify_lib.verify_plans(cfg, plans, microbatch=args.microbatch, seq=args.seq, seed=args.seed)
    passed = all(r.passed for r in results)
    if args.json:
        print(json.dumps({"command": _command_line(), "machine": machine_info(), "jax_version": jax.__version__,
                          "xla_preset": args.xla_preset, "model": config_to_dict(cfg), "passed": passed,
                          "results": [r.to_json() for r in results]}, indent=2))
        return 0 if passed else 1
    _console().print(verify_table(results, f"{cfg.name} ({cfg.dtype}) · microbatch {args.microbatch} × seq "
                                           f"{args.seq} · {jax.default_backend()} · against save-all"))
    for r in results:
        if not r.passed:
            print(f"FAIL {r.plan}: max relative error {r.max_rel_err:.3g} > {r.tolerance:g}; above the tolerance: "
                  f"{', '.join(r.failing_leaves) or 'the loss'}")
    offloads = any(p is plan_lib.Placement.OFFLOAD for pl in plans for g in plan_lib.resolve(pl, cfg).values()
                   for p in g.values())
    if jax.default_backend() == "cpu" and offloads:
        print("note: XLA:CPU ignores host offloading; on CPU this checks the remat/save policy, not the offload "
              "path. Run on a GPU for that.")
    return 0 if passed else 1


def cmd_profile(args) -> int:
    from tierax import xla_flags

    xla_flags.configure(preset=args.xla_preset)

    from tierax import plan as plan_lib
    from tierax.measure import trace as trace_lib
    from tierax.report.measure_tables import profile_table

    cfg = _resolve_model(args)
    plan = plan_lib.load_plan(args.plan, cfg)
    out = args.out or f"profiles/{cfg.name}-{plan.name}"
    result = trace_lib.capture(cfg, plan, out_dir=out, steps=args.steps, warmup=args.warmup,
                               microbatch=args.microbatch, seq=args.seq, command=_command_line())
    if args.json:  # the record written to OUT/profile.json: command, machine, versions, analysis, memory
        with open(f"{out}/profile.json") as f:
            print(f.read(), end="")
        return 0
    _console().print(profile_table(result.analysis, f"{cfg.name} · plan {plan.name} · microbatch {args.microbatch} "
                                                    f"× seq {args.seq} · {result.analysis.backend} trace"))
    mem = result.memory
    if mem.get("runtime"):
        peak = max(m["peak_bytes_in_use"] for m in mem["runtime"])
        print(f"runtime peak device memory (process): {peak / 2**20:.1f} MiB; host (compiled): "
              f"{mem['compiled']['host_total'] / 2**20:.1f} MiB")
    else:
        print(f"compiled peak device memory: {mem['compiled']['peak'] / 2**20:.1f} MiB ({mem['runtime_note']})")
    print(f"wrote {out}/profile.json")
    if result.perfetto_trace:
        print(f"Perfetto trace (open at https://ui.perfetto.dev): {result.perfetto_trace}")
    if result.xplane:
        print(f"XPlane (TensorBoard/XProf): {result.xplane}")
    return 0


def cmd_report(args) -> int:
    from tierax import xla_flags

    xla_flags.configure()

    from tierax.report import report as report_lib

    written = report_lib.build_report(args.results, args.out, trace=args.trace, readme=args.readme,
                                      command=_command_line())
    for f in written:
        print(f"wrote {f}")
    return 0


def _add_measure_parsers(sub) -> None:
    v = sub.add_parser(
        "verify", help="check a plan's loss and gradients against save-all",
        description="Run one step (loss and gradients) under each plan and under save-all on the local backend, "
                    "same parameters and tokens, and compare every gradient leaf (max relative error per leaf, "
                    "relative to the reference leaf's largest magnitude). Tolerance by compute dtype: float32 "
                    "1e-5, float16 1e-2, bfloat16 2e-2. Exit 0: all pass; 1: a plan fails (its worst leaves are "
                    "named); 2: bad input.")
    _add_model_args(v)
    v.add_argument("--plan", default="qkv-offload",
                   help="a preset or plan YAML file, or a comma-separated list (default: qkv-offload)")
    v.add_argument("--microbatch", type=int, default=4, help="sequences in the batch (default 4)")
    v.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    v.add_argument("--seed", type=int, default=0, help="parameter seed; tokens use seed + 1 (default 0)")
    v.add_argument("--xla-preset", default="none", help="XLA flag preset: none, lhs, lhs-pipelined")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "profile", help="trace a few train steps; report compute, transfers and their overlap",
        description="Capture a JAX profiler trace of a few train steps under a plan (Perfetto JSON for "
                    "ui.perfetto.dev and the .xplane.pb are kept) and report per step: compute time, host↔device "
                    "transfer time per direction, how much of it overlaps compute, the exposed part and the "
                    "achieved bandwidth. A CPU trace has no host↔device transfers and says so.")
    _add_model_args(p)
    p.add_argument("--plan", default="qkv-offload", help="a preset or plan YAML file (default: qkv-offload)")
    p.add_argument("--steps", type=int, default=3, help="traced steps (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untraced steps first (default 2)")
    p.add_argument("--microbatch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")
    p.add_argument("--out", help="output directory, replaced when complete (default: profiles/MODEL-PLAN)")
    p.add_argument("--xla-preset", default="none", help="XLA flag preset: none, lhs, lhs-pipelined")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_profile)

    r = sub.add_parser(
        "report", help="charts and a Markdown summary from recorded results",
        description="From bench results (tierax.bench/1) or GPU-check results (tierax.gpu-check/1): a "
                    "throughput-vs-peak-memory chart per results file, a Markdown summary, a one-step "
                    "transfer/compute timeline if --trace is given, and optionally the README's performance "
                    "table (the section between the perf-table markers).")
    r.add_argument("results", nargs="+", metavar="RESULTS.json", help="results files")
    r.add_argument("--out", required=True, metavar="DIR", help="directory for the PNGs and summary.md")
    r.add_argument("--trace", metavar="DIR", help="a `tierax profile --out` directory (or a trace file)")
    r.add_argument("--readme", metavar="FILE",
                   help="rewrite the section between <!-- perf-table:start --> and <!-- perf-table:end --> in FILE")
    r.set_defaults(func=cmd_report)


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
    b.add_argument("--verify", action="store_true",
                   help="first check each plan's gradients against save-all (tierax verify); exit 1 and run no "
                        "benchmark if any fails")
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
    _add_planning_parsers(sub)
    _add_training_parsers(sub)
    _add_measure_parsers(sub)
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
