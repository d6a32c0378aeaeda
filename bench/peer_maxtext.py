#!/usr/bin/env python3
"""tierax's train step side by side with MaxText 0.2.5's and a pure-JAX reference, on the same jax.

MaxText needs Python ≥ 3.12, so it lives in its own venv (default
``~/.cache/tierax/maxtext-venv``; created with pyenv's 3.12 and ``pip install
"maxtext[tpu]==0.2.5"`` if missing), and tierax is installed into that same venv with
``pip install --no-deps -e .`` so all three steps run on one jax.  The script re-runs
itself under that venv's Python.  Per shape, each program runs in a process of its own (so
none shares an allocator, buffers or global flags with another: building two programs in one
process moved their ratio depending on which was built first):

* **maxtext**: MaxText's own trainer setup (``maxtext.trainers.pre_train.train``:
  ``initialize`` → ``train_utils.setup_train_loop`` → ``jit_train_and_eval_step`` with its
  ``train_step``) and its synthetic batch; the jitted step its training loop calls;
* **tierax**: exactly what ``tierax bench`` times (``step.init_state`` →
  ``step.make_train_step`` on a one-device mesh → ``measure.harness.prepare``), plan
  ``remat-full`` or ``save-all``;
* **reference**: ``bench/reference_step.py`` (pure JAX, no tierax import);

then the parent times them in interleaved rounds: each round asks each process for
``--steps-per-round`` steps, the order rotating from round to round, every step blocking
until done.  Per shape it records each program's median step time (median over rounds of
the round's median), CPU seconds and minor page faults per step, the per-round ratios
tierax/maxtext and tierax/reference with their median, quartiles and range, and each
program's loss at the first step (≈ ln 32000 ≈ 10.37 at initialisation).

Shapes (fixed before any tuning; issue 15): Llama-style, d_model 256/512/1024, 4 layers,
MLP 4·d, d/64 heads of 64 (as many kv heads), vocab 32000, batch 4 × 256 tokens,
float32 and bfloat16 compute (float32 parameters), remat full and none; AdamW
(b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1), no gradient clipping, no dropout.

    python bench/peer_maxtext.py [--shapes d256-float32-full,d512-bfloat16-none --rounds 11
                                  --steps-per-round 1 --out bench/results/peer_maxtext.json]

``--shapes`` takes names ``d{256,512,1024}-{float32,bfloat16}-{full,none}`` (default all 12);
the record says which ran.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import _common

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV = pathlib.Path(
    os.environ.get(
        "TIERAX_MAXTEXT_VENV", pathlib.Path.home() / ".cache" / "tierax" / "maxtext-venv"
    )
)
MAXTEXT_VERSION = "0.2.5"
D_MODELS, DTYPES, REMATS = (256, 512, 1024), ("float32", "bfloat16"), ("full", "none")
ALL_SHAPES = [f"d{d}-{t}-{r}" for d in D_MODELS for t in DTYPES for r in REMATS]
LAYERS, VOCAB, BATCH, SEQ = 4, 32000, 4, 256
PROGRAMS = ("maxtext", "tierax", "reference")


def parse_shape(name: str) -> dict:
    if name not in ALL_SHAPES:
        raise SystemExit(f"unknown shape {name!r}; choose from {', '.join(ALL_SHAPES)}")
    d, dtype, remat = name.split("-")
    d = int(d[1:])
    return {
        "name": name,
        "d_model": d,
        "dtype": dtype,
        "remat": remat,
        "layers": LAYERS,
        "heads": d // 64,
        "head_dim": 64,
        "mlp_dim": 4 * d,
        "vocab": VOCAB,
        "batch": BATCH,
        "seq": SEQ,
    }


# --------------------------------------------------------------------------- the venv


def venv_python() -> pathlib.Path:
    return VENV / "bin" / "python"


def ensure_venv() -> None:
    """Create the MaxText venv if needed; install tierax into it without dependencies."""
    py = venv_python()
    ok = (
        py.exists()
        and subprocess.run(
            [
                str(py),
                "-c",
                f"import maxtext.version as v, sys; sys.exit(v.__version__ != '{MAXTEXT_VERSION}')",
            ],
            capture_output=True,
        ).returncode
        == 0
    )
    if not ok:
        base = (
            shutil.which("python3.12")
            or subprocess.run(
                ["pyenv", "prefix", "3.12"], capture_output=True, text=True
            ).stdout.strip()
            + "/bin/python3.12"
        )
        print(f"creating {VENV} with {base} (MaxText {MAXTEXT_VERSION}, ~3 GB)", flush=True)
        subprocess.run([base, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", f"maxtext[tpu]=={MAXTEXT_VERSION}"], check=True
        )
    has = (
        subprocess.run(
            [
                str(py),
                "-c",
                "import tierax, pathlib, sys; "
                f"sys.exit(pathlib.Path(tierax.__file__).resolve().parents[1] != "
                f"pathlib.Path('{ROOT / 'src'}'))",
            ],
            capture_output=True,
        ).returncode
        == 0
    )
    if not has:
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True
        )


# --------------------------------------------------------------------------- the programs


def _maxtext(shape: dict, workdir: str):
    """MaxText's jitted train step, its state and synthetic batch (its trainer's own setup)."""
    import jax
    import maxtext
    from flax import nnx
    from maxtext.trainers.pre_train import train as mt
    from maxtext.utils import maxtext_utils, sharding, train_utils

    base = pathlib.Path(maxtext.__file__).parent / "configs" / "base.yml"
    d = shape["d_model"]
    argv = [
        "train",
        str(base),
        "run_name=peer",
        f"base_output_directory={workdir}",
        "dataset_type=synthetic",
        "steps=100000",
        f"per_device_batch_size={shape['batch']}",
        f"max_target_length={shape['seq']}",
        f"base_emb_dim={d}",
        f"base_num_decoder_layers={shape['layers']}",
        f"base_mlp_dim={shape['mlp_dim']}",
        f"base_num_query_heads={shape['heads']}",
        f"base_num_kv_heads={shape['heads']}",
        f"head_dim={shape['head_dim']}",
        f"vocab_size={shape['vocab']}",
        f"dtype={shape['dtype']}",
        "weight_dtype=float32",
        f"remat_policy={shape['remat']}",
        "decoder_block=llama2",
        "attention=dot_product",
        "rope_max_timescale=500000",
        "enable_dropout=false",
        "gradient_clipping_threshold=0",
        "learning_rate=1e-3",
        "adam_b1=0.9",
        "adam_b2=0.95",
        "adam_eps=1e-8",
        "adam_weight_decay=0.1",
        "enable_checkpointing=false",
        "enable_tensorboard=false",
        "scan_layers=true",
        "hardware=cpu",
        "skip_jax_distributed_system=true",
        "log_period=1000000",
    ]
    config, recorder = mt.initialize(argv)
    (
        init_rng,
        _ckpt,
        state_mesh_shardings,
        _model,
        mesh,
        _lr,
        _it,
        _loader,
        _ramp,
        eval_it,
        state,
    ) = train_utils.setup_train_loop(config, recorder)
    jit_model, state = nnx.split(state)
    params_shardings, state_mesh_shardings = sharding.maybe_update_params_sharding_with_opt(
        config, state_mesh_shardings
    )
    p_train_step, _ = train_utils.jit_train_and_eval_step(
        config,
        jit_model,
        mesh,
        state,
        state_mesh_shardings,
        mt.train_step,
        mt.eval_step,
        eval_it,
        params_shardings,
    )
    import contextlib

    from flax.core.spmd import logical_axis_rules as rules_ctx

    def ctx():
        s = contextlib.ExitStack()
        s.enter_context(jax.set_mesh(mesh))
        s.enter_context(rules_ctx(config.logical_axis_rules))
        return s

    with ctx():
        data_sharding = sharding.get_input_data_sharding(config, mesh)
        shaped = maxtext_utils.get_shaped_batch(config, batch_sharding=data_sharding)
        batch = mt.make_synthetic_batch(config, shaped)
        compiled = p_train_step.lower(state, batch).compile()
    box = {"state": state, "metrics": None}

    def step():
        with ctx():
            box["state"], box["metrics"] = p_train_step(box["state"], batch)
        jax.block_until_ready(box["state"])

    def loss():
        m = box["metrics"]
        flat = {
            "/".join(str(getattr(k, "key", k)) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(m)[0]
        }
        keys = [k for k in flat if k.endswith("learning/loss")] or [k for k in flat if "loss" in k]
        return float(flat[keys[0]])

    n_params = sum(
        x.size for x in jax.tree.leaves(nnx.state(nnx.merge(jit_model, state).model, nnx.Param))
    )
    return step, loss, n_params, compiled


def _tierax(shape: dict):
    """What ``tierax bench`` times for this shape."""
    import jax

    from tierax import plan as plan_lib
    from tierax.measure import harness
    from tierax.mesh import MeshShape
    from tierax.models.config import LlamaConfig
    from tierax.sharding import rules as sh
    from tierax.train import step as step_lib

    cfg = LlamaConfig(
        name=f"peer-{shape['name']}",
        vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        num_layers=shape["layers"],
        num_heads=shape["heads"],
        num_kv_heads=shape["heads"],
        head_dim=shape["head_dim"],
        mlp_dim=shape["mlp_dim"],
        dtype=shape["dtype"],
    )
    plan = plan_lib.preset("remat-full" if shape["remat"] == "full" else "save-all", cfg)
    mesh = MeshShape(fsdp=1).make()
    optimizer = step_lib.make_optimizer()
    tokens = jax.device_put(
        step_lib.synthetic_batch(cfg, shape["batch"], shape["seq"]), sh.batch_sharding(mesh)
    )

    def build():
        graphdef, state = step_lib.init_state(cfg, optimizer, mesh=mesh)
        return step_lib.make_train_step(
            graphdef, cfg, plan, optimizer, step_lib.shardings_of(state)
        ), state

    prepared = harness.prepare(build, tokens, warmup=0, devices=mesh.devices.flat)
    n_params = sum(x.size for x in jax.tree.leaves(prepared.state.params))
    return (
        (lambda: prepared.step(tokens)),
        (lambda: float(prepared.metrics["loss"])),
        n_params,
        prepared.fn,
    )


def _reference(shape: dict):
    import jax

    sys.path.insert(0, str(ROOT / "bench"))
    import reference_step

    fn, state, tokens = reference_step.make(
        d_model=shape["d_model"],
        dtype=shape["dtype"],
        remat=shape["remat"],
        layers=shape["layers"],
        vocab=shape["vocab"],
        batch=shape["batch"],
        seq=shape["seq"],
    )
    n_params = reference_step.param_count(state)
    fn = fn.lower(state, tokens).compile()
    box = {"state": state, "metrics": None}

    def step():
        box["state"], box["metrics"] = fn(box["state"], tokens)
        jax.block_until_ready(box["state"])

    return step, (lambda: float(box["metrics"]["loss"])), n_params, fn


def _cost(compiled, name: str, dump: str | None) -> dict:
    """XLA's static count for the compiled step: FLOPs and bytes accessed (machine-independent)."""
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    if dump:
        pathlib.Path(dump).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(dump) / f"{name}.hlo.txt").write_text(compiled.as_text())
    return {"xla_flops": ca.get("flops"), "xla_bytes_accessed": ca.get("bytes accessed")}


def serve(program: str, shape_name: str, warmup: int, dump: str | None = None) -> None:
    """One program in its own process: build it, warm it up, then run steps on request.

    Protocol (one JSON object per line on stdout; commands on stdin): after the build
    ``{"ready": info}``; ``run K`` → ``{"steps": [[wall_s, cpu_s, minor_faults], ...]}``
    for K steps, each timed alone; ``quit`` ends it.  Each program has the process to itself:
    no other program's buffers, allocator state or global flags (MaxText sets some) are there.
    """
    shape = parse_shape(shape_name)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")
    import resource

    import jax

    out = sys.stdout
    sys.stdout = sys.stderr  # the programs' own prints must not break the protocol
    workdir = tempfile.mkdtemp(prefix="tierax-peer-")
    builders = {
        "tierax": lambda: _tierax(shape),
        "reference": lambda: _reference(shape),
        "maxtext": lambda: _maxtext(shape, workdir),
    }
    t0 = time.perf_counter()
    step, loss, n_params, compiled = builders[program]()
    cost = _cost(compiled, f"{shape_name}-{program}", dump)
    del compiled
    step()  # first step (compile where not done already)
    first_loss = loss()
    for _ in range(warmup):
        step()
    info = {
        "setup_and_first_step_s": time.perf_counter() - t0,
        "first_step_loss": first_loss,
        "param_count": int(n_params),
        "jax_version": jax.__version__,
        **cost,
    }
    out.write(json.dumps({"ready": info}) + "\n")
    out.flush()
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd or cmd[0] == "quit":
                break
            steps = []
            for _ in range(int(cmd[1])):
                r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                step()
                wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
                steps.append(
                    [
                        wall,
                        (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                        r1.ru_minflt - r0.ru_minflt,
                    ]
                )
            out.write(json.dumps({"steps": steps}) + "\n")
            out.flush()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Program:
    """The parent's handle on one ``serve`` process."""

    def __init__(
        self, py: str, program: str, shape_name: str, warmup: int, dump: str | None, env: dict
    ):
        self.name = program
        self.proc = subprocess.Popen(
            [
                py,
                __file__,
                "--serve",
                program,
                "--shapes",
                shape_name,
                "--warmup",
                str(warmup),
                *(["--dump-hlo", dump] if dump else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.info = self._read()["ready"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise SystemExit(
                f"{self.name}: its worker process ended (exit {code}) before answering; "
                "its error is printed above"
            )
        return json.loads(line)

    def run(self, k: int) -> list:
        self.proc.stdin.write(f"run {k}\n")
        self.proc.stdin.flush()
        return self._read()["steps"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


def run_shape(
    py: str,
    shape_name: str,
    programs: list[str],
    rounds: int,
    per_round: int,
    warmup: int,
    dump: str | None,
    env: dict,
) -> dict:
    """Start one process per program (one after another), then time them in interleaved rounds."""
    handles = []
    try:
        for p in [p for p in PROGRAMS if p in programs]:
            handles.append(_Program(py, p, shape_name, warmup, dump, env))
        per = {h.name: [] for h in handles}  # per round: [[wall, cpu, faults] per step]
        # the machine's 1-minute load average after each round (2 cores: above ~2, others were
        # running)
        load = []
        for r in range(rounds):
            rot = handles[r % len(handles) :] + handles[: r % len(handles)]
            for h in rot:
                per[h.name].append(h.run(per_round))
            load.append(os.getloadavg()[0])
            print(
                f"  {shape_name} round {r + 1}/{rounds} (load {load[-1]:.1f}): "
                + "  ".join(
                    f"{h.name} {statistics.median(s[0] for s in per[h.name][-1]):.3f}s"
                    for h in handles
                ),
                flush=True,
            )
    finally:
        for h in handles:
            h.close()
    return {
        "shape": parse_shape(shape_name),
        "info": {h.name: h.info for h in handles},
        "step_times_s": {p: [[s[0] for s in rnd] for rnd in rounds_] for p, rounds_ in per.items()},
        "step_cpu_s": {p: [[s[1] for s in rnd] for rnd in rounds_] for p, rounds_ in per.items()},
        "step_minor_faults": {
            p: [[s[2] for s in rnd] for rnd in rounds_] for p, rounds_ in per.items()
        },
        "load_per_round": load,
    }


# --------------------------------------------------------------------------- the summary


def _quantiles(xs):
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {
        "median": statistics.median(xs),
        "q25": q[0],
        "q75": q[2],
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
    }


def _ratio(info: dict, key: str, other: str):
    a, b = info["tierax"].get(key), info[other].get(key)
    return a / b if a and b else None


def summarise(res: dict) -> dict:
    per = res["step_times_s"]
    round_med = {p: [statistics.median(ts) for ts in rounds] for p, rounds in per.items()}
    out = {
        "shape": res["shape"]["name"],
        "programs": {},
        "load_per_round": res.get("load_per_round"),
    }
    for p, meds in round_med.items():
        cpu = [c for rnd in res.get("step_cpu_s", {}).get(p, []) for c in rnd]
        faults = [f for rnd in res.get("step_minor_faults", {}).get(p, []) for f in rnd]
        out["programs"][p] = {
            "median_step_s": statistics.median(meds),
            "round_medians_s": meds,
            "step_times_s": per[p],
            "median_step_cpu_s": statistics.median(cpu) if cpu else None,
            "median_minor_faults_per_step": statistics.median(faults) if faults else None,
            **res["info"][p],
        }
    for other in ("maxtext", "reference"):
        if "tierax" in round_med and other in round_med:
            ratios = [a / b for a, b in zip(round_med["tierax"], round_med[other], strict=False)]
            out[f"tierax_over_{other}"] = {
                "ratio_of_medians": statistics.median(round_med["tierax"])
                / statistics.median(round_med[other]),
                "per_round": _quantiles(ratios),
                "per_round_ratios": ratios,
                "cpu_ratio_of_medians": (
                    out["programs"]["tierax"]["median_step_cpu_s"]
                    / out["programs"][other]["median_step_cpu_s"]
                )
                if out["programs"][other]["median_step_cpu_s"]
                else None,
                "xla_bytes_accessed_ratio": _ratio(res["info"], "xla_bytes_accessed", other),
                "xla_flops_ratio": _ratio(res["info"], "xla_flops", other),
            }
    return out


DOCS_MARKER = "peer-maxtext"


def _per_round(r: dict) -> str:
    q = r["per_round"]
    return (
        f"{q['median']:.2f} [{q['q25']:.2f}–{q['q75']:.2f}] ({q['min']:.2f}–{q['max']:.2f}); "
        f"{r['ratio_of_medians']:.2f}"
    )


def markdown(doc: dict) -> str:
    """The docs table of the record: per shape the three programs' median step times, the
    per-round ratios and the CPU-seconds and XLA byte-count ratios (every figure read from it)."""
    lines = [
        "| shape | s/step MaxText · tierax · reference | tierax ÷ MaxText | tierax ÷ reference | "
        "CPU s ÷ MaxText · ÷ reference | compiled bytes ÷ MaxText · ÷ reference |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        p, m, ref = r["programs"], r["tierax_over_maxtext"], r["tierax_over_reference"]
        programs = ("maxtext", "tierax", "reference")
        steps = " · ".join(f"{p[k]['median_step_s']:.2f}" for k in programs)
        lines.append(
            f"| {r['shape']} | {steps} | {_per_round(m)} | {_per_round(ref)} | "
            f"{m['cpu_ratio_of_medians']:.2f} · {ref['cpu_ratio_of_medians']:.2f} | "
            f"{m['xla_bytes_accessed_ratio']:.3f} · {ref['xla_bytes_accessed_ratio']:.3f} |"
        )
    lines += [
        "",
        f"{_common.made_by(doc)}, MaxText "
        f"{doc['maxtext_version']}; {doc['rounds']} rounds × {doc['steps_per_round']} step per "
        "shape.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_docs(ap, "tierax.peer-maxtext/1", nothing="run")
    ap.add_argument(
        "--shapes",
        default=",".join(ALL_SHAPES),
        help="comma-separated subset of " + ", ".join(ALL_SHAPES),
    )
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps-per-round", type=int, default=1)
    ap.add_argument(
        "--warmup", type=int, default=2, help="steps after the first, per program, before timing"
    )
    _common.add_out(ap, "peer_maxtext.json")
    ap.add_argument(
        "--no-venv",
        action="store_true",
        help="run with this interpreter (needs MaxText here, or --programs tierax,reference)",
    )
    ap.add_argument("--dump-hlo", help="write each program's compiled HLO text to this folder")
    ap.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run one program (see serve())
    args = ap.parse_args(argv)
    if args.docs:
        doc = args.docs
        print(f"wrote {_common.write_docs_table(DOCS_MARKER, markdown(doc))}")
        return 0
    programs = [p for p in args.programs.split(",") if p]
    if bad := [p for p in programs if p not in PROGRAMS]:
        raise SystemExit(f"unknown program(s) {bad}; choose from {PROGRAMS}")
    if args.serve:
        serve(args.serve, args.shapes, args.warmup, args.dump_hlo)
        return 0
    shapes = [parse_shape(s)["name"] for s in args.shapes.split(",") if s]
    py = sys.executable
    if not args.no_venv:
        ensure_venv()
        py = str(venv_python())
    # The record's jax and Python are the venv interpreter's: the ones all three programs ran on.
    versions = _common.run(
        [
            py,
            "-c",
            "import importlib.metadata as m, json, sys; "
            "print(json.dumps([m.version('jax'), sys.version.split()[0]]))",
        ],
        timeout=60,
    )
    if versions.returncode:
        raise SystemExit(f"{py} cannot report its jax version:\n{versions.stderr}")
    envl = _common.envelope("tierax.peer-maxtext/1", argv)
    envl["jax_version"], envl["machine"]["python"] = json.loads(versions.stdout)

    results = []
    for s in shapes:
        print(
            f"{s}: {', '.join(programs)} × {args.rounds} rounds × {args.steps_per_round} steps",
            flush=True,
        )
        env = dict(
            os.environ, JAX_PLATFORMS="cpu", DECOUPLE_GCLOUD="TRUE", PYTHONPATH=str(ROOT / "src")
        )
        res = run_shape(
            py, s, programs, args.rounds, args.steps_per_round, args.warmup, args.dump_hlo, env
        )
        results.append(summarise(res))
        r = results[-1]
        print(
            "  "
            + "  ".join(
                f"{k}: {v['ratio_of_medians']:.3f} (rounds {v['per_round']['min']:.3f}–"
                f"{v['per_round']['max']:.3f})"
                for k, v in r.items()
                if k.startswith("tierax_over")
            ),
            flush=True,
        )
        done = [x["shape"] for x in results]
        doc = envl | {
            "maxtext_version": MAXTEXT_VERSION if "maxtext" in programs else None,
            "shapes_run": done,
            "shapes_not_run": [x for x in ALL_SHAPES if x not in done],
            "programs": programs,
            "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
            "warmup_steps": args.warmup,
            "method": (
                "each program runs in its own process (built one after another), so no program "
                "shares an allocator, buffers or global flags with another; then interleaved "
                "rounds (order rotating), the parent asking each process in turn for "
                "--steps-per-round steps; a program's round time is the median of its steps in "
                "that round; median_step_s is the median of round times; tierax_over_X.per_round "
                "are quantiles of the per-round ratios; cpu: the process's user + system seconds "
                "per step (getrusage), minor faults likewise; xla_* are the compiled step's static "
                "counts (XLA cost analysis)"
            ),
            "shape_definition": {
                "layers": LAYERS,
                "vocab": VOCAB,
                "batch": BATCH,
                "seq": SEQ,
                "mlp": "4·d_model",
                "heads": "d_model/64 (kv heads the same), head_dim 64",
                "param_dtype": "float32",
                "optimizer": "AdamW lr 1e-3 b1 0.9 b2 0.95 eps 1e-8 wd 0.1, no clipping",
            },
            "ln_vocab": math.log(VOCAB),
            "results": results,
        }
        # after every shape: an interrupted run keeps what it measured
        _common.write_record(args.out, doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
