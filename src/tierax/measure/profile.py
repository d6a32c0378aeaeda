"""``tierax profile``: trace a few train steps and analyse them (:mod:`tierax.measure.trace`).

Writes the profiler's files and ``profile.json`` into a new (or empty) directory,
which appears only once complete; nothing already on disk is removed.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
from dataclasses import dataclass, field

from tierax.errors import TieraxError
from tierax.fileio import check_output_dir, make_temp_dir
from tierax.measure.trace import STEP_ANNOTATION, TraceAnalysis, analyze, load_events
from tierax.records import PROFILE_SCHEMA, envelope, write_record


@dataclass(frozen=True)
class ProfileResult:
    out_dir: str
    perfetto_trace: str | None
    xplane: str | None
    analysis: TraceAnalysis
    memory: dict
    doc: dict = field(default_factory=dict)  # the record written to OUT/profile.json

    def to_json(self) -> dict:
        return {
            "out_dir": self.out_dir,
            "perfetto_trace": self.perfetto_trace,
            "xplane": self.xplane,
            "analysis": self.analysis.to_json(),
            "memory": self.memory,
        }


def _profiler_options():
    import jax

    opts_cls = getattr(jax.profiler, "ProfileOptions", None)
    if opts_cls is None:
        return None
    opts = opts_cls()
    # No Python call stacks and no HLO protos: they make traces 30× larger and the analysis needs
    # neither.
    for attr, value in (("python_tracer_level", 0), ("enable_hlo_proto", False)):
        if hasattr(opts, attr):
            setattr(opts, attr, value)
    return opts


def record(fn, *, steps: int, log_dir: str | os.PathLike) -> None:
    """Trace ``steps`` calls of ``fn(i)`` (each must block until its device work is done), one
    annotation each."""
    import jax

    opts = _profiler_options()
    kwargs = {"create_perfetto_trace": True}
    if opts is not None:
        kwargs["profiler_options"] = opts
    with jax.profiler.trace(str(log_dir), **kwargs):
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=i):
                fn(i)


def fresh_dir(path: pathlib.Path) -> pathlib.Path:
    """``path`` if it does not exist yet, else the first free ``path-2``, ``path-3``, … (nothing is
    replaced)."""
    if not path.exists():
        return path
    n = 2
    while path.with_name(f"{path.name}-{n}").exists():
        n += 1
    return path.with_name(f"{path.name}-{n}")


def _place_dir(tmp: pathlib.Path, out: pathlib.Path) -> None:
    """Move the finished ``tmp`` to ``out``, which must be absent or an empty directory (never
    replaced otherwise)."""
    if out.is_dir() and any(out.iterdir()):
        raise TieraxError(f"{out} filled up while profiling; the profile is kept in {tmp}")
    os.replace(tmp, out)  # rename(2) replaces an empty directory atomically


def summary_lines(result: ProfileResult) -> list[str]:
    """What ``tierax profile`` prints under its table: memory, and where the files are."""
    mem, out = result.memory, result.out_dir
    if mem.get("runtime"):
        peak = max(m["peak_bytes_in_use"] for m in mem["runtime"])
        lines = [
            f"runtime peak device memory (process): {peak / 2**20:.1f} MiB; host (compiled): "
            f"{mem['compiled']['host_total'] / 2**20:.1f} MiB"
        ]
    else:
        lines = [
            f"compiled peak device memory: {mem['compiled']['peak'] / 2**20:.1f} MiB "
            f"({mem['runtime_note']})"
        ]
    lines.append(f"wrote {out}/profile.json")
    if result.perfetto_trace:
        lines.append(f"Perfetto trace (open at https://ui.perfetto.dev): {result.perfetto_trace}")
    if result.xplane:
        lines.append(f"XPlane (TensorBoard/XProf): {result.xplane}")
    return lines


def capture(
    cfg,
    plan,
    *,
    out_dir: str | os.PathLike,
    steps: int = 3,
    warmup: int = 2,
    microbatch: int = 8,
    seq: int = 64,
    seed: int = 0,
    command: str = "",
) -> ProfileResult:
    """Profile ``steps`` train steps of ``cfg`` under ``plan`` on the default device, after
    ``warmup`` steps.

    Writes ``out_dir`` (which must not exist or be empty; it appears only once
    complete): the profiler's ``plugins/profile/<run>/`` files and ``profile.json``
    (the analysis, memory, versions).  Nothing that was there is ever removed.

    Raises:
      TieraxError: bad sizes, a non-empty ``out_dir``, or a plan that does not fit the model.
    """
    from tierax import plan as plan_lib
    from tierax.measure import harness, memory
    from tierax.train import step as step_lib

    if steps < 1 or warmup < 0 or microbatch < 1 or seq < 1:
        raise TieraxError(
            f"profile needs steps ≥ 1, warmup ≥ 0, microbatch ≥ 1, seq ≥ 1; got steps={steps}, "
            f"warmup={warmup}, microbatch={microbatch}, seq={seq}"
        )
    plan = plan_lib.load_plan(plan, cfg)
    out = check_output_dir(out_dir, "profile directory", allow_existing=False)
    optimizer = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    tokens = step_lib.synthetic_batch(cfg, microbatch, seq, seed=seed + 1)

    def build():
        graphdef, state = step_lib.init_state(cfg, optimizer, seed=seed, plan=plan)
        shardings = step_lib.shardings_of(state) if plan.offloads_state else None
        return step_lib.make_train_step(graphdef, cfg, plan, optimizer, shardings), state

    # Warm-up calls settle buffer placement; they stay out of the trace.
    prepared = harness.prepare(build, tokens, warmup=warmup)
    compiled_mem = prepared.compiled_memory

    def one(_i):
        prepared.step(tokens)

    tmp = make_temp_dir(out.parent, out.name)
    try:
        record(one, steps=steps, log_dir=tmp)
        events, f = load_events(tmp)
        analysis = analyze(events, source=str(out / f.relative_to(tmp)))
        runtime = memory.runtime_stats()
        mem = {
            "compiled": compiled_mem.to_json(),
            "runtime": [m.to_json() for m in runtime] if runtime is not None else None,
            "runtime_note": memory.RUNTIME_NOTE if runtime is not None else memory.NO_RUNTIME_NOTE,
        }
        perfetto = next(iter(sorted(tmp.rglob("perfetto_trace.json.gz"))), None)
        xplane = next(iter(sorted(tmp.rglob("*.xplane.pb"))), None)
        result = ProfileResult(
            str(out),
            str(out / perfetto.relative_to(tmp)) if perfetto else None,
            str(out / xplane.relative_to(tmp)) if xplane else None,
            analysis,
            mem,
        )
        from tierax.models import config_to_dict

        doc = (
            envelope(PROFILE_SCHEMA, command)
            | {
                "model": config_to_dict(cfg),
                "plan": plan.to_dict(),
                "microbatch": microbatch,
                "seq": seq,
                "steps": steps,
                "warmup": warmup,
            }
            | result.to_json()
        )
        write_record(tmp / "profile.json", doc)
        _place_dir(tmp, out)
        result = dataclasses.replace(result, doc=doc)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
