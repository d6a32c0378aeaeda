"""Verbs that build and run or compile a step: bench, compile, verify, profile, report."""

from __future__ import annotations

import json
import pathlib
import sys

from tierax import launch, records
from tierax.cli.common import (
    console,
    load_plans,
    mesh_option,
    note_local_fp8,
    progress,
    read_target_config,
    resolve_model,
)
from tierax.errors import TieraxError
from tierax.fileio import check_output_dir, check_output_file

CPU_OFFLOAD_NOTE = (
    "note: XLA:CPU ignores host offloading; offload plans run as their save-on-device twin here."
)


def _plan_specs(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def cmd_bench(args) -> int:
    specs = _plan_specs(args.plans)
    mesh = mesh_option(args, specs, required=False)  # what the plans record, with the flags
    out = (
        records.check_replaceable(
            pathlib.Path(args.out), records.BENCH_SCHEMA, "--out", force=args.force
        )
        if args.out
        else None
    )
    launch.start(
        devices=args.devices,
        mesh_devices=mesh.size if mesh else None,
        preset=args.xla_preset,
        run_step=True,
    )
    import jax

    from tierax.measure import bench
    from tierax.report.tables import bench_table

    cfg = resolve_model(args, [f"dtype={args.dtype}"] if args.dtype else [])
    if mesh is not None:
        mesh.check_model(cfg, where="--mesh")
    cfg = launch.local_attention(cfg, what="tierax bench")
    note_local_fp8(cfg, "tierax bench")
    launch.check_local_memory(cfg, shards=mesh.size if mesh else 1, what="tierax bench")
    plans = load_plans(args.plans, cfg, "--plans", preset=args.xla_preset)
    verified = _verify_before_bench(cfg, plans, args, mesh) if args.verify else None
    if verified is not None and not all(v.passed for v in verified):
        return 1
    if verified is not None:  # what the check found, where it passed too
        worst = max(verified, key=lambda v: v.max_rel_err)
        print(
            f"gradient check before bench: {len(verified)} plan(s) equal save-all's gradients "
            f"within {worst.tolerance:g} relative (worst {worst.max_rel_err:.2e}, plan "
            f"{worst.plan}, {worst.num_leaves} leaves)",
            file=sys.stderr if args.json else sys.stdout,  # --json: stdout is the record alone
        )
    if getattr(args, "max_microbatch", False) and jax.default_backend() == "cpu":
        raise TieraxError(
            "bench --max-microbatch finds where the device refuses a step (out of memory); "
            "XLA:CPU allocates from host RAM and has no such boundary: run it on a TPU or GPU, or "
            "use `tierax plan --max-microbatch` for the predicted one"
        )
    print(launch.describe_backend(), file=sys.stderr if args.json else sys.stdout)
    with progress(f"bench {cfg.name}", len(plans) + args.steps, disable=args.json) as advance:
        doc = bench.measure(
            cfg,
            plans,
            steps=args.steps,
            microbatch=args.microbatch,
            seq=args.seq,
            mesh=mesh,
            command=records.command_line(),
            progress=advance,
            max_microbatch=getattr(args, "max_microbatch", False),
        )
    if verified is not None:
        doc["verify"] = [v.to_json() for v in verified]
    if out:
        records.write_record(out, doc)
    if args.json:
        print(json.dumps(doc, indent=2))  # the whole record: `tierax report` reads it
        return 0
    console().print(
        bench_table(
            doc["records"],
            doc["peak_flops_per_device_measured"],
            bench.title(doc),
            not_run=doc["not_run"],
            datasheet=doc["peak_flops_per_device_datasheet"],
        )
    )
    for n in doc["not_run"]:
        print(f"{n['plan']}: {n['error'].splitlines()[0][:300]}")
    for m in doc.get("max_microbatch", ()):
        refused = f", refused at {m['refused_at']}" if m["refused_at"] else ""
        print(
            f"{m['plan']}: largest microbatch that runs here {m['microbatch']} × seq {m['seq']}"
            f"{refused} ({len(m['probes'])} compiles)"
        )
    if doc["machine"]["platform"] == "cpu":
        print(CPU_OFFLOAD_NOTE)
    if out:
        print(f"wrote {out}")
    return 0


def _verify_before_bench(cfg, plans, args, mesh):
    """``bench --verify``: every plan's gradients against save-all; failures go to stderr."""
    import jax

    from tierax.measure import verify as verify_lib
    from tierax.mesh import MeshShape
    from tierax.report.measure_tables import verify_table

    # On bench's mesh (its default: fsdp over every device), with bench's batch (--microbatch is
    # per device there, the global batch in verify).
    mesh = mesh or MeshShape(fsdp=jax.device_count())
    results = verify_lib.verify_plans(
        cfg, plans, microbatch=args.microbatch * mesh.batch_ways, seq=args.seq, mesh=mesh
    )
    failed = [r for r in results if not r.passed]
    if failed:
        console(stderr=True).print(
            verify_table(results, f"gradient check of {cfg.name} before bench")
        )
        print(
            f"tierax bench: gradients of {', '.join(r.plan for r in failed)} differ from save-all "
            f"(worst leaf {failed[0].worst_leaves[0].path}); no benchmark was run",
            file=sys.stderr,
        )
    return results


def cmd_compile(args) -> int:
    if args.maxtext is not None or args.maxtext_overrides:
        from tierax.cli import maxtext_compile

        return maxtext_compile.cmd_compile(args)
    if getattr(args, "maxtext_flags_only", False):
        raise TieraxError(
            "--maxtext-flags-only chooses the flags of MaxText's own step's compile: it goes with "
            "--maxtext CONFIG"
        )
    from tierax import hardware

    mesh = mesh_option(args, [args.plan])
    spec = hardware.compile_target(args.target)
    target_config = read_target_config(args.target_config)
    cfg = resolve_model(args, target=args.target)  # a model the target cannot run: before JAX
    from tierax.costmodel import calibrated

    rates_file = calibrated.load(args.rates) if args.rates else None  # refused before JAX
    if spec.kind == "tpu":  # host platform only; libtpu builds compile-only TPU devices
        spec.topology_name(mesh.size)  # an unsupported slice size fails before JAX starts
        from tierax.xla import compile as compile_lib

        launch.start_tpu_compile(args.xla_preset, spec.accelerator_type(mesh.size))
        compile_lib.check_tpu_aot()
    else:
        launch.start(preset=args.xla_preset, deviceless_gpu=True)
        from tierax.xla import compile as compile_lib

        compile_lib.check_gpu_aot()
    from tierax import plan as plan_lib
    from tierax.interop import files
    from tierax.report.tables import compile_table

    mesh.check_model(cfg, where="--mesh")
    plan = files.load_plan(args.plan, cfg)
    plan_lib.check_mechanism_preset(plan, args.xla_preset, "--plan")
    result, _ = compile_lib.compile_for_target(
        cfg,
        plan,
        args.target,
        microbatch=args.microbatch,
        seq=args.seq,
        mesh=mesh,
        xla_preset=args.xla_preset,
        target_config=target_config,
        grad_accum=args.grad_accum or 1,
        calibration=rates_file,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        console().print(compile_table(result))
    return 0


def cmd_verify(args) -> int:
    specs = _plan_specs(args.plan)
    mesh = mesh_option(args, specs, required=False)  # what the plans record, with the flags
    launch.start(mesh_devices=mesh.size if mesh else None, preset=args.xla_preset, run_step=True)
    import jax

    from tierax.measure import verify as verify_lib
    from tierax.models import config_to_dict
    from tierax.report.measure_tables import verify_table

    cfg = resolve_model(args)  # verify_plans refuses a mesh the model or batch cannot take
    cfg = launch.local_attention(cfg, what="tierax verify")
    note_local_fp8(cfg, "tierax verify")
    launch.check_local_memory(
        cfg, shards=mesh.size if mesh else 1, copies=6, what="tierax verify (two gradient sets)"
    )
    plans = load_plans(args.plan, cfg, "--plan", preset=args.xla_preset)
    results = verify_lib.verify_plans(
        cfg, plans, microbatch=args.microbatch, seq=args.seq, seed=args.seed, mesh=mesh
    )
    passed = all(r.passed for r in results)
    if args.json:
        doc = records.envelope(records.VERIFY_SCHEMA, records.command_line()) | {
            "xla_preset": args.xla_preset,
            "model": config_to_dict(cfg),
            "passed": passed,
            "mesh": mesh.to_dict() if mesh else None,
            "results": [r.to_json() for r in results],
        }
        print(json.dumps(doc, indent=2))
        return 0 if passed else 1
    console().print(verify_table(results, _verify_title(cfg, args, mesh, jax.default_backend())))
    for r in results:
        if not r.passed:
            print(
                f"FAIL {r.plan}: max relative error {r.max_rel_err:.3g} > {r.tolerance:g}; above "
                f"the tolerance: {', '.join(r.failing_leaves) or 'the loss'}"
            )
    if jax.default_backend() == "cpu" and any(_offloads(p, cfg) for p in plans):
        print(
            "note: XLA:CPU ignores host offloading; on CPU this checks the remat/save policy, not "
            "the offload path. Run on a GPU for that."
        )
    return 0 if passed else 1


def _verify_title(cfg, args, mesh, backend: str) -> str:
    on = f"mesh {mesh}" if mesh else "1 device"
    return (
        f"{cfg.name} ({cfg.dtype}) · microbatch {args.microbatch} × seq {args.seq} · "
        f"{backend}, {on} · against save-all"
    )


def _offloads(plan, cfg) -> bool:
    from tierax import plan as plan_lib

    return any(
        p is plan_lib.Placement.OFFLOAD
        for g in plan_lib.resolve(plan, cfg).values()
        for p in g.values()
    )


def cmd_profile(args) -> int:
    from tierax.measure import profile as profile_lib

    mesh_option(args, [args.plan], required=False)  # the plan's model, microbatch and seq
    cfg = resolve_model(args)
    out = check_output_dir(args.out, allow_existing=False) if args.out else None
    launch.start(preset=args.xla_preset, run_step=True)
    from tierax import plan as plan_lib
    from tierax.interop import files
    from tierax.report.measure_tables import profile_table

    plan = files.load_plan(args.plan, cfg)
    plan_lib.check_mechanism_preset(plan, args.xla_preset, "--plan")
    cfg = launch.local_attention(cfg, what="tierax profile")
    launch.check_local_memory(cfg, what="tierax profile")
    out = out or profile_lib.fresh_dir(pathlib.Path("profiles") / f"{cfg.name}-{plan.name}")
    result = profile_lib.capture(
        cfg,
        plan,
        out_dir=out,
        steps=args.steps,
        warmup=args.warmup,
        microbatch=args.microbatch,
        seq=args.seq,
        command=records.command_line(),
    )
    if args.json:
        print(json.dumps(result.doc, indent=2))
        return 0
    console().print(
        profile_table(
            result.analysis,
            f"{cfg.name} · plan {plan.name} · microbatch {args.microbatch} "
            f"× seq {args.seq} · {result.analysis.backend} trace",
        )
    )
    for line in profile_lib.summary_lines(result):
        print(line)
    return 0


def cmd_report(args) -> int:
    out = check_output_dir(args.out, allow_existing=False)
    if args.readme:
        check_output_file(args.readme, "--readme")
    from tierax.report import report as report_lib

    for f in report_lib.build_report(
        args.results,
        out,
        trace=args.trace,
        readme=args.readme,
        command=records.command_line(),
        sweeps=args.sweep,
    ):
        print(f"wrote {f}")
    return 0
