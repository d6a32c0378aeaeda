"""The argument parser: every verb, its options and help.  Sizes are checked here (exit 2 with
usage)."""

from __future__ import annotations

import argparse

from tierax.cli import maxtext_program, maxtext_simulate, measuring, planning, training
from tierax.cli.common import (
    Given,
    add_grad_accum_arg,
    add_model_args,
    add_set_arg,
    add_size_args,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)

PRESET_HELP = "XLA flag preset: none, lhs, lhs-pipelined"
# What --devices counts on a TPU target: JAX's devices, a chip where it shows one device (v5p's two
# TensorCores are one megacore device), a TensorCore where it shows two (TPU7x).
TPU_DEVICES_HELP = (
    "--devices counts JAX devices: a chip on v5e, v5p, v6e; a TensorCore on v7x, 2 a chip"
)
TARGET_HELP = (
    "GPUs h100, h200, b200, gb200; projections gb300, vr200; TPUs v5e, v5p, v6e, v7x "
    f"({TPU_DEVICES_HELP}); or cpu (measured by calibrate)"
)


CALIBRATE_DESCRIPTION = (
    "Measure the local matmul rate per compute dtype (float32, bfloat16), the memory bandwidth "
    "of streaming copies and of a layer's non-matmul work, on a CPU the first-touch rate of fresh "
    "memory and the read rates of XLA:CPU's transposing fusions (strided and row-aliased), and "
    "on a GPU the host→device and device→host copy bandwidths, and store them for the cost "
    "model under this machine's target key (cpu, or the GPU kind) in "
    "~/.cache/tierax/calibration.json (env TIERAX_CALIBRATION to move it). simulate and plan "
    "then use the measured rates instead of datasheet figures, and say which rates are measured."
)


def _given(p, flag: str, default: str, help: str) -> None:
    """``flag`` with ``default``, a value a plan file may supply instead: ``<dest>_given`` says
    whether the command line gave it (:class:`tierax.cli.common.Given`)."""
    p.add_argument(flag, default=default, action=Given, help=help)
    p.set_defaults(**{flag.removeprefix("--").replace("-", "_") + "_given": False})


def _devices_and_mesh(p, devices: str, mesh: str) -> None:
    """``--devices N`` and ``--mesh AXES``, with the verb's own help texts."""
    p.add_argument("--devices", type=positive_int, help=devices)
    p.add_argument("--mesh", help=mesh)


def _out_and_force(p, out: str, other: str) -> None:
    """``--out FILE`` and ``--force``: without it an existing file that is not ``other`` is
    refused before any work."""
    p.add_argument("--out", help=out)
    p.add_argument(
        "--force",
        action="store_true",
        help=f"let --out replace an existing file that is not {other} (without it such a file is "
        "refused before any work)",
    )


def _preset_and_json(p, json_help: str = "print one JSON object") -> None:
    """``--xla-preset`` (default none) and ``--json``."""
    p.add_argument("--xla-preset", default="none", help=PRESET_HELP)
    p.add_argument("--json", action="store_true", help=json_help)


def _models_and_plans(sub) -> None:
    m = sub.add_parser(
        "models",
        help="list the named model configs, or show one as YAML",
        description="List the named model configs with parameter counts, or `show NAME`: "
        "print one (with --set overrides) as YAML that --model-config accepts.",
    )
    m.add_argument(
        "action", nargs="?", choices=["show"], help="show: print one config as a model config file"
    )
    m.add_argument("name", nargs="?", metavar="NAME", help="the named config to show")
    m.add_argument("--json", action="store_true", help="print JSON")
    add_set_arg(m)
    m.set_defaults(func=planning.cmd_models)

    pl = sub.add_parser(
        "plans",
        help="list plan presets or show one",
        description="List the plan presets, or show one resolved for a model.",
    )
    add_model_args(pl)
    pl.add_argument("--show", metavar="PLAN", help="a preset name or plan YAML file to show")
    pl.add_argument(
        "--yaml", action="store_true", help="print the plan as YAML (usable as a plan file)"
    )
    pl.add_argument(
        "--emit",
        metavar="TOOL",
        help="print the plan as TOOL's config: maxtext (overrides YAML, "
        "usable as a plan file too); sizes from the options below",
    )
    pl.add_argument(
        "--target",
        help="with --emit: h100, h200, b200, gb200, gb300, vr200, v5e, "
        "v5p, v6e, v7x or cpu (default h200)",
    )
    _devices_and_mesh(
        pl,
        "with --emit: devices (default: the mesh's product); --devices N without --mesh means "
        "fsdp=N",
        "with --emit: mesh axes, e.g. fsdp=8 (data, fsdp, tensor, expert; default: the mesh the "
        "plan file carries)",
    )
    # Defaults are applied in cmd_plans: None tells an option given without --emit (refused there).
    pl.add_argument(
        "--schedule", help="with --emit: serial, lhs or lhs-pipelined (its XLA flags; default lhs)"
    )
    shown = planning.SHOW_DEFAULTS
    pl.add_argument(
        "--microbatch",
        type=positive_int,
        help=f"with --emit: sequences per device (default {shown['microbatch']})",
    )
    pl.add_argument(
        "--seq", type=positive_int, help=f"with --emit: sequence length (default {shown['seq']})"
    )
    pl.add_argument(
        "--grad-accum",
        type=positive_int,
        metavar="N",
        help="with --emit: microbatches per optimizer update (default 1)",
    )
    pl.set_defaults(func=planning.cmd_plans)


def _planning(sub) -> None:
    def common(p):
        add_model_args(p)
        target = f"{TARGET_HELP} (default h200, or the target a plan file records)"
        _given(p, "--target", "h200", target)
        _devices_and_mesh(
            p,
            "devices (default: the mesh's product, else 1); --devices N without --mesh means "
            "fsdp=N (every device shards the weights and splits the batch)",
            "mesh axes, e.g. fsdp=16,expert=8 (data, fsdp, tensor, expert); auto: the mesh the "
            "plan file carries (plan --mesh auto: search it)",
        )
        add_size_args(p, microbatch=8)
        p.add_argument("--json", action="store_true", help="print one JSON object")

    i = sub.add_parser(
        "inventory",
        help="the activations a plan places, from an abstract trace",
        description="Per layer group and activation: bytes per layer per device, layers, recompute "
        "FLOPs; per device parameter, gradient and optimizer bytes. Nothing is allocated.",
    )
    common(i)
    maxtext_program.add_args(i)
    i.set_defaults(func=maxtext_program.cmd_inventory)

    s = sub.add_parser(
        "simulate",
        help="predict memory and step time of a plan on a target",
        description="Predicted peak device bytes, host bytes and step time of a plan (cost model).",
    )
    common(s)
    maxtext_program.add_args(s)
    _given(
        s,
        "--plan",
        "qkv-offload",
        "a preset or plan YAML file (with --maxtext: a preset, plan file or MaxText overrides, "
        "set as remat_policy=custom and its names; without it the config's remat_policy)",
    )
    _given(
        s,
        "--schedule",
        "lhs",
        "serial, lhs or lhs-pipelined (default lhs, or the schedule a plan file records)",
    )
    add_grad_accum_arg(s)
    _rate_arg(s)
    s.set_defaults(func=maxtext_simulate.cmd_simulate)

    p = sub.add_parser(
        "plan",
        help="find the fastest plan that fits, and explain it",
        description="Choose device/offload/remat per activation to minimise predicted step time "
        "within the device and host budgets (exact integer program, HiGHS). With --mesh auto "
        "--devices N, also choose the mesh: every data × fsdp × tensor × expert factorisation of "
        "N the model admits, the placement solved exactly for each, ranked by tokens/s at "
        "--global-batch (pipeline and context parallelism are not searched).",
    )
    common(p)
    p.add_argument("--schedule", default="lhs", help="serial, lhs or lhs-pipelined")
    add_grad_accum_arg(p)
    p.add_argument(
        "--budget-gib",
        type=positive_float,
        help="device budget (default: capacity minus a 5%% reserve)",
    )
    p.add_argument(
        "--host-budget-gib",
        type=nonnegative_float,
        help="host budget per device (default: host memory per device); 0: offload nothing",
    )
    p.add_argument(
        "--max-microbatch",
        action="store_true",
        help="find the largest microbatch that fits, and its plan",
    )
    _out_and_force(
        p,
        "write the plan as YAML (usable by bench, compile, simulate)",
        "a plan or MaxText overrides file tierax wrote",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compile the chosen plan deviceless for --target, correct the model's workspace term "
        "from XLA's peak and re-plan until the compiled plan fits and agrees within 5 %% (exit 1 "
        "if not)",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="with --maxtext on a TPU target: do not confirm the plan with MaxText's own compile "
        "(there the default, as --check); the plan is then reported as predicted, not compiled, "
        "and planned within the budget less the fidelity record's worst held-out miss",
    )
    p.add_argument(
        "--check-iterations",
        type=positive_int,
        help=f"with --check: at most this many compiles (default {planning.CHECK_ITERATIONS}; "
        f"{planning.MAX_MICROBATCH_CHECK_ITERATIONS} with --max-microbatch)",
    )
    p.add_argument(
        "--segments",
        action="store_true",
        help="also consider splitting each layer group at one layer into two runs of layers with "
        "their own placements (every split point, solved exactly; the plan YAML gets 'segments')",
    )
    p.add_argument(
        "--state-on-device",
        action="store_true",
        help="keep the training state (AdamW moments, master weights) on device; by default the "
        "planner also places it, per layer group, in pinned host memory where that is faster or "
        "needed to fit (the plan YAML gets 'state'; the step streams offloaded moments through "
        "the device layer by layer for the update)",
    )
    p.add_argument(
        "--for",
        dest="for_tool",
        metavar="TOOL",
        help="maxtext: one placement per activation name across layer groups (what MaxText "
        "expresses); also reports what the restriction costs against the unrestricted plan",
    )
    p.add_argument(
        "--emit",
        metavar="TOOL",
        help="maxtext: write (--out) or print MaxText overrides instead of a "
        "tierax plan YAML (exit 2 if the plan is not expressible)",
    )
    _rate_arg(p)
    p.add_argument(
        "--sweep",
        metavar="KEY=LO:HI:STEP",
        help="solve at every point of budget (GiB), microbatch, or a --rate key (e.g. "
        "host_link=100:1000:100); prints a table, and with --out F.png draws the frontier (F.json "
        "beside it)",
    )
    p.add_argument(
        "--global-batch",
        type=positive_int,
        help="with --mesh auto: sequences per optimizer step every candidate trains (default "
        "--microbatch × --devices); a mesh with tensor=t runs t× the microbatch per device, and "
        "accumulates gradients when that does not fit",
    )
    p.add_argument(
        "--top",
        type=positive_int,
        help="with --mesh auto: candidates in the table (and compiled by --check; default 5)",
    )
    maxtext_program.add_args(p)
    p.set_defaults(func=maxtext_simulate.cmd_plan)

    c = sub.add_parser(
        "calibrate",
        help="measure this machine's rates for the cost model",
        description=CALIBRATE_DESCRIPTION,
    )
    c.add_argument(
        "--json", action="store_true", help="no progress display; print the stored entry as JSON"
    )
    c.add_argument(
        "--runs",
        metavar="RUNS.yaml",
        help="instead of measuring: fit the cost model's factors (GEMM, attention, non-matmul "
        "memory, exposed collectives) per target to the measured runs this file lists (each a "
        "model, target, mesh, sizes, plan and step_seconds or maxtext_log); prints each run's "
        "leave-one-out error beside the uncalibrated model's; needs --out",
    )
    c.add_argument("--out", metavar="RATES.yaml", help="with --runs: the calibration to write")
    c.add_argument(
        "--factors",
        metavar="R[,R...]",
        help="with --runs: the resources to fit, of gemm, attention, memory, collectives "
        "(default: per group, the subset its runs can fit with the smallest leave-one-out error)",
    )
    c.add_argument(
        "--by",
        choices=["target", "platform"],
        help="with --runs: one factor set per target kind (h100, v6e; the default) or per platform "
        "(gpu, tpu: one set for every target of the platform)",
    )
    c.set_defaults(func=planning.cmd_calibrate)


def _rates_file_arg(p) -> None:
    p.add_argument(
        "--rates",
        metavar="RATES.yaml",
        help="a calibration from measured runs (written by `tierax calibrate --runs`): the "
        "target's factors applied to its rates before any --rate; the rates line says which",
    )


def _rate_arg(p) -> None:
    _rates_file_arg(p)
    p.add_argument(
        "--rate",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="what-if override of a target rate (repeatable): host_link (GB/s per direction, both "
        "ways), d2h, h2d (GB/s, one direction), hbm_size (GB), hbm_bw (TB/s), matmul (TFLOP/s), "
        "fused_attention_fwd, fused_attention_bwd (TFLOP/s of the fused attention kernel), "
        "fp8_matmul (TFLOP/s of fp8 GEMMs, quantization=fp8), "
        "interconnect (GB/s inside an NVLink domain), scale_out (GB/s per device between "
        "domains), nvlink_domain (devices per domain), gpus_per_domain (this job's devices per "
        "domain; default: spread evenly), host_memory (GB)",
    )


def _running(sub) -> None:
    b = sub.add_parser(
        "bench",
        help="run plans side by side on the local devices",
        description="Compile and time a train step under each plan on the local devices.",
    )
    add_model_args(b)
    b.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="activation/compute dtype (an override of `dtype`; param_dtype is kept)",
    )
    b.add_argument(
        "--plans",
        default="save-all,remat-full,minimal,qkv-offload",
        help="comma-separated presets or plan YAML files",
    )
    b.add_argument(
        "--steps", type=positive_int, default=10, help="timed steps per plan (default 10)"
    )
    add_size_args(b, microbatch=8)
    _devices_and_mesh(
        b,
        "run on N host CPU devices (the CPU backend, even where an accelerator is present; "
        "default: the accelerator JAX finds, else the CPU)",
        "mesh axes, e.g. data=2,fsdp=4 (default: the mesh the plan files carry, else fsdp over all "
        "devices; auto: the plans' mesh, required)",
    )
    _preset_and_json(b, "print a JSON list of per-plan records")
    _out_and_force(
        b,
        "also write the full JSON record (machine, versions, command) to this file",
        "a bench record",
    )
    b.add_argument(
        "--verify",
        action="store_true",
        help="first check each plan's gradients against save-all (tierax verify); exit 1 and run "
        "no benchmark if any fails",
    )
    b.add_argument(
        "--max-microbatch",
        action="store_true",
        help="then find each plan's largest microbatch that runs on the device (doubling, then "
        "bisection on the device's own out-of-memory errors; a TPU or GPU only)",
    )
    b.set_defaults(func=measuring.cmd_bench)

    c = sub.add_parser(
        "compile",
        help="compile a plan for a GPU or TPU target without that device",
        description="Compile the full train step under a plan for a GPU or TPU target on this "
        "machine (deviceless XLA:GPU or XLA:TPU compilation) and report XLA's memory figures "
        "and a static copy/compute overlap check.",
    )
    add_model_args(c)
    maxtext_program.add_args(c)
    c.add_argument(
        "--maxtext-flags-only",
        action="store_true",
        help="with --maxtext: compile with MaxText's train_compile's own libtpu/XLA flags and the "
        "environment's only (default: also the flags simulate/plan --maxtext model the program "
        "under, which the compile states)",
    )
    _given(
        c,
        "--plan",
        "qkv-offload",
        "a preset or plan YAML file (default: qkv-offload; with --maxtext: set as "
        "remat_policy=custom and its names, without it the config's remat_policy)",
    )
    _given(
        c,
        "--target",
        "h200",
        "h100, h200, b200, gb200 (XLA:GPU) or v5e, v5p, v6e, v7x (XLA:TPU, needs the tpu-aot "
        f"extra; {TPU_DEVICES_HELP}); default h200, or the target a plan file records",
    )
    c.add_argument(
        "--target-config",
        metavar="FILE",
        help="a GpuTargetConfigProto text file instead of the built-in one",
    )
    _rates_file_arg(c)
    _devices_and_mesh(
        c,
        "compile-only devices (default: the mesh's product, else 1); --devices N without --mesh "
        "means fsdp=N",
        "mesh axes, e.g. fsdp=8 or data=2,fsdp=4 (default: the mesh the plan file carries; auto: "
        "that mesh, required)",
    )
    add_size_args(c, microbatch=8)
    add_grad_accum_arg(c)
    _preset_and_json(c)
    c.set_defaults(func=measuring.cmd_compile)

    v = sub.add_parser(
        "verify",
        help="check a plan's loss and gradients against save-all",
        description="Run one step (loss and gradients) under each plan and under save-all on the "
        "local backend, same parameters and tokens, and compare every gradient leaf (max relative "
        "error per leaf, relative to the reference leaf's largest magnitude). Tolerance by compute "
        "dtype: float32 1e-5, float16 1e-2, bfloat16 2e-2. Exit 0: all pass; 1: a plan fails (its "
        "worst leaves are named); 2: bad input.",
    )
    add_model_args(v)
    v.add_argument(
        "--plan",
        default="qkv-offload",
        help="a preset or plan YAML file, or a comma-separated list (default: qkv-offload)",
    )
    add_size_args(v, microbatch=4, per_device=False)
    _devices_and_mesh(
        v,
        "host CPU devices to create (CPU backend; default: the mesh's product, else 1)",
        "run each plan and save-all sharded on this mesh, e.g. fsdp=2,expert=2,tensor=2 (default: "
        "the mesh the plan files carry, else one device)",
    )
    v.add_argument(
        "--seed",
        type=nonnegative_int,
        default=0,
        help="parameter seed; tokens use seed + 1 (default 0)",
    )
    _preset_and_json(v)
    v.set_defaults(func=measuring.cmd_verify)

    p = sub.add_parser(
        "profile",
        help="trace a few train steps; report compute, transfers and their overlap",
        description="Capture a JAX profiler trace of a few train steps under a plan (Perfetto JSON "
        "for ui.perfetto.dev and the .xplane.pb are kept) and report per step: compute time, "
        "host↔device transfer time per direction, how much of it overlaps compute, the exposed "
        "part and the achieved bandwidth. A CPU trace has no host↔device transfers and says so.",
    )
    add_model_args(p)
    p.add_argument(
        "--plan", default="qkv-offload", help="a preset or plan YAML file (default: qkv-offload)"
    )
    p.add_argument("--steps", type=positive_int, default=3, help="traced steps (default 3)")
    p.add_argument(
        "--warmup", type=nonnegative_int, default=2, help="untraced steps first (default 2)"
    )
    add_size_args(p, microbatch=8, per_device=False)
    p.add_argument(
        "--out",
        help="a new (or empty) output directory; nothing in an existing one is touched "
        "(default: profiles/MODEL-PLAN, or -2, -3, … if taken)",
    )
    _preset_and_json(p)
    p.set_defaults(func=measuring.cmd_profile)

    r = sub.add_parser(
        "report",
        help="charts and a Markdown summary from recorded results",
        description="From bench results (tierax.bench/1) or GPU-check results "
        "(tierax.gpu-check/1): a throughput-vs-peak-memory chart per results file, a Markdown "
        "summary, a one-step transfer/compute timeline if --trace is given, and optionally the "
        "README's performance table (the section between the perf-table markers).",
    )
    r.add_argument("results", nargs="+", metavar="RESULTS.json", help="results files")
    r.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="a new (or empty) directory for the PNGs and summary.md; nothing in an "
        "existing one is touched",
    )
    r.add_argument(
        "--trace", metavar="DIR", help="a `tierax profile --out` directory (or a trace file)"
    )
    r.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="SWEEP.json",
        help="a planner frontier to embed: `tierax plan --sweep ... --out F.png`'s F.json, or "
        "bench/whatif.py's record (repeatable)",
    )
    r.add_argument(
        "--readme",
        metavar="FILE",
        help="rewrite the section between <!-- perf-table:start --> and <!-- perf-table:end --> in "
        "FILE",
    )
    r.set_defaults(func=measuring.cmd_report)


def _training(sub) -> None:
    t = sub.add_parser(
        "train",
        help="train a model under a plan from a config file",
        description="Train from a YAML config (configs/demo-train.yaml; keys: docs/guide/train.md) "
        "with KEY=VALUE overrides (dotted for sections: mesh.fsdp=4, optimizer.lr=3e-4, "
        "model.d_model=128). Writes metrics.jsonl, metrics.png and the resolved config to log.dir, "
        "Orbax checkpoints to checkpoint.dir. Ctrl-C stops at the next step boundary and "
        "checkpoints it.",
    )
    t.add_argument("config", metavar="CONFIG.yaml", help="the train config file")
    t.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, applied in order (before or after the flags: CONFIG --resume "
        "steps=25 works)",
    )
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in checkpoint.dir (none: start fresh)",
    )
    t.add_argument(
        "--verify",
        action="store_true",
        help="first check the plan's gradients against save-all (tierax.measure.verify); stop if "
        "they differ",
    )
    t.add_argument(
        "--json",
        action="store_true",
        help="no progress display; print one JSON summary per process",
    )
    t.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="multi-process: process 0's address (env TIERAX_COORDINATOR)",
    )
    t.add_argument(
        "--num-processes",
        type=positive_int,
        metavar="N",
        help="multi-process: process count (env TIERAX_NUM_PROCESSES)",
    )
    t.add_argument(
        "--process-id",
        type=nonnegative_int,
        metavar="I",
        help="multi-process: this process, 0-based (env TIERAX_PROCESS_ID)",
    )
    t.set_defaults(func=training.cmd_train)

    d = sub.add_parser(
        "data",
        help="prepare training data",
        description="prepare INPUT... --out DIR: tokenize text files, JSONL or Parquet (--field) "
        "with a tokenizer file (a Hugging Face tokenizer.json, a SentencePiece model "
        "or a tiktoken BPE file, told apart by content; default: byte-level) into "
        "token shards plus index.json, for data.source: tokens.",
    )
    d.add_argument(
        "action", choices=["prepare"], help="prepare: tokenize documents into a token directory"
    )
    d.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="text files (one document each), JSONL files (one document per line) or "
        "Parquet files (one per row)",
    )
    d.add_argument("--out", required=True, metavar="DIR", help="the token directory to write")
    d.add_argument(
        "--tokenizer",
        default="bytes",
        metavar="FILE",
        help="tokenizer file, read from disk (default: bytes, the byte-level tokenizer)",
    )
    d.add_argument(
        "--field", default="text", help="JSONL field / Parquet column with the text (default: text)"
    )
    d.add_argument(
        "--validation-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="hold out this share of whole documents as the validation split (default 0)",
    )
    d.add_argument(
        "--shard-tokens",
        type=positive_int,
        default=1 << 28,
        metavar="N",
        help="tokens per shard file (default 2^28)",
    )
    d.add_argument(
        "--bos",
        metavar="TOKEN",
        help="the BOS token put before each document (none: no BOS; default: the "
        "tokenizer's own choice)",
    )
    d.add_argument(
        "--eos",
        metavar="TOKEN",
        help="the end-of-text token after each document (default: the tokenizer's)",
    )
    d.add_argument(
        "--max-document-mib",
        type=positive_int,
        default=64,
        metavar="MIB",
        help="refuse larger documents (memory is bounded by one document; default 64)",
    )
    d.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the token files an earlier `data prepare` wrote in --out (its index.json "
        "and shards; any other file there stays)",
    )
    d.set_defaults(func=training.cmd_data)

    pm = sub.add_parser(
        "plot-metrics",
        help="plot loss and throughput of a training run",
        description="Draw loss and throughput (tokens/s, TFLOP/s/device) curves of "
        "RUN_DIR/metrics.jsonl to a PNG (default RUN_DIR/metrics.png).",
    )
    pm.add_argument("run_dir", metavar="RUN_DIR", help="the log.dir of a `tierax train` run")
    pm.add_argument("--out", metavar="FILE.png", help="where to write the PNG (.png only)")
    pm.add_argument(
        "--force",
        action="store_true",
        help="replace an existing file at --out that is not a metrics plot tierax wrote (without "
        "it such a file is refused, nothing written)",
    )
    pm.set_defaults(func=training.cmd_plot_metrics)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tierax",
        description="Schedule accelerator memory in JAX training: keep, offload or recompute each "
        "activation.",
    )
    p.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    _models_and_plans(sub)
    _running(sub)
    _planning(sub)
    _training(sub)
    return p
