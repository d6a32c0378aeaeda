#!/usr/bin/env python3
"""``tierax plan --maxtext ... --check`` per case, and MaxText's own compiler on the file it wrote.

Each case plans MaxText's own program (a MaxText 0.2.5 model file at a per-device batch and
sequence on a target) with ``--check``: each plan's MaxText keys compiled by MaxText's own train
step (``compile --maxtext``'s compile), the model corrected by the compile's miss, re-planned.  The
record keeps every compile's predicted and compiled peak, the compiles used, the exit status and
the emitted file.  For a TPU target MaxText's own ahead-of-time compiler then compiles the emitted
file (``python -m maxtext.trainers.pre_train.train_compile <base.yml> <the user's keys> <the
file's keys> compile_topology=SLICE ...``, in the environment the file's header names): its verdict
(compiled, or its out-of-memory refusal) and memory figures, the peak (arguments + outputs + temp −
aliased) beside XLA:TPU's available HBM in the docs (XLA:TPU compiles some programs whose figures
exceed it: a compile is not taken as fitting without the figures).

    python bench/maxtext_plan_check.py [--cases NAME,...] [--out FILE.json]
    python bench/maxtext_plan_check.py --docs bench/results/maxtext_plan_check.json

The full-size llama3-8b case compiles MaxText's 32-layer step at 8 × 8192 tokens per device: about
4-5 minutes and several GB of memory per compile on 2 cores (one child process at a time).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import _common
import _maxtext
import maxtext_compile

SCHEMA = "tierax.bench.maxtext_plan_check/1"
MARKER = "maxtext-plan-check"
# (name, target, devices, MaxText keys after base.yml)
CASES = [
    (
        "llama3-8b-8x8192",  # the case: 8 v5p chips, fsdp=8, 8 sequences of 8192 a chip
        "v5p",
        8,
        [
            "model_name=llama3-8b",
            "per_device_batch_size=8",
            "max_target_length=8192",
            "ici_fsdp_parallelism=8",
        ],
    ),
    (
        "llama3-8b-8x8192-vocab-tiled",  # the same, its loss in 2 vocabulary tiles
        "v5p",
        8,
        [
            "model_name=llama3-8b",
            "per_device_batch_size=8",
            "max_target_length=8192",
            "ici_fsdp_parallelism=8",
            "num_vocab_tiling=2",
        ],
    ),
    (
        "llama3-8b-2layers-h200",  # a GPU case: the model file cut to 2 layers, 4 H200s
        "h200",
        4,
        _maxtext.keys("llama3-8b", 2, 4, 4096, ["ici_fsdp_parallelism=4"]),
    ),
]



def _overrides(user: list[str], text: str) -> list[str]:
    from tierax.interop.maxtext_program.emit import command_overrides, read_overrides

    return command_overrides(user, read_overrides(text))


def plan_side(name: str, target: str, devices: int, keys: list[str], tmp: str) -> dict:
    out = os.path.join(tmp, f"{name}.yml")
    cmd = _common.tierax(
        "plan", "--maxtext", _maxtext.base_yml(), *keys, "--target", target,
        "--devices", str(devices), "--check", "--emit", "maxtext", "--out", out, "--json",
    )  # fmt: skip
    proc = _common.run(cmd, timeout=7200, env=_maxtext.env())
    shown = [a if a != out else "mt.yml" for a in cmd[2:]]
    base = "<maxtext>/configs/base.yml"
    rec = {
        "command": "tierax " + " ".join(shown[1:]).replace(_maxtext.base_yml(), base),
        "returncode": proc.returncode,
        "wall_s": round(proc.wall_s, 1),
        "peak_rss_bytes": proc.peak_rss_bytes,
        "check_lines": [ln for ln in proc.stdout.splitlines() + proc.stderr.splitlines()
                        if ln.startswith("check ")],
    }  # fmt: skip
    if proc.returncode == 2:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("tierax plan: error:")]
        return rec | {"error": errors[-1] if errors else proc.stderr.strip().splitlines()[-1]}
    if "{" not in proc.stdout:
        return rec | {"error": proc.stderr.strip().splitlines()[-3:]}
    doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    rec |= {
        "converged": doc["converged"],
        "compiles": doc["compiles"],
        "stopped": doc["stopped"],
        "budget_bytes": doc["budget_bytes"],
        "fitted_iteration": doc["fitted_iteration"],
        "iterations": [
            {k: i[k] for k in ("iteration", "predicted_peak_bytes", "xla_peak_bytes", "xla_fits",
                               "out_of_memory", "workspace_correction_bytes", "host_bytes",
                               "xla_host_bytes", "compile_s", "peak_error")}
            for i in doc["iterations"]
        ],
    }  # fmt: skip
    if os.path.exists(out):
        with open(out) as f:
            rec["emitted"] = f.read()
    return rec


def train_compile_side(keys: list[str], text: str, target: str, devices: int) -> dict:
    """MaxText's own train_compile of the emitted file over the user's keys, in the file's
    environment (its LIBTPU_INIT_ARGS / XLA_FLAGS appended to this one's)."""
    env = _maxtext.env()
    from tierax.interop.maxtext_program import emit

    file_env = emit.read_environment(text)
    for name in ("LIBTPU_INIT_ARGS", "XLA_FLAGS"):
        if name in file_env:
            env[name] = f"{env.get(name, '')} {file_env[name]}".strip()
    rec = maxtext_compile.maxtext_side(_overrides(keys, text), target, devices, env=env)
    rec["env"] = {k: file_env[k] for k in ("LIBTPU_INIT_ARGS", "XLA_FLAGS") if k in file_env}
    if "error" not in rec:
        rec["peak_bytes"] = (
            rec["argument_size_in_bytes"] + rec["output_size_in_bytes"]
            + rec["temp_size_in_bytes"] - rec["alias_size_in_bytes"]
        )  # fmt: skip
    return rec


def hbm_limit(target: str) -> int:
    """XLA:TPU's available HBM of ``target`` (its out-of-memory message's figure): what a
    compiled peak must fit."""
    from tierax import hardware

    return hardware.fit_limit_bytes(hardware.get_target(target))


def run_case(name: str, target: str, devices: int, keys: list[str]) -> dict:
    case = {"name": name, "target": target, "devices": devices, "keys": keys}
    with tempfile.TemporaryDirectory(prefix="tierax-bench-mtpc-") as tmp:
        case["plan"] = plan_side(name, target, devices, keys, tmp)
    text = case["plan"].get("emitted")
    if text and target in maxtext_compile.SLICE:
        case["maxtext_train_compile"] = train_compile_side(keys, text, target, devices)
    return case


def _gib(n) -> str:
    return "—" if n is None else f"{n / 2**30:.2f}"


def render(doc: dict) -> str:
    lines = [
        "| case | target × devices | check | predicted peak (GiB) | MaxText compile peak (GiB) "
        "| fits |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for c in doc["cases"]:
        p = c["plan"]
        where = f"{c['target']} × {c['devices']}"
        for i in p.get("iterations", []):
            refused = " (refused: out of memory)" if i["out_of_memory"] else ""
            if not i["compile_s"]:
                refused += " (the keys compiled before: not compiled again)"
            lines.append(
                f"| {c['name']} | {where} | {i['iteration']} | {_gib(i['predicted_peak_bytes'])} "
                f"| {_gib(i['xla_peak_bytes'])}{refused} | {'yes' if i['xla_fits'] else 'NO'} |"
            )
        if "error" in p:
            checks = "".join(f"\n  * `{ln}`" for ln in p["check_lines"])
            verdicts.append(f"* **{c['name']}**: exit {p['returncode']}: `{p['error']}`{checks}")
            continue
        v = (
            f"* **{c['name']}**: exit {p['returncode']}, "
            f"{'converged' if p['converged'] else 'did NOT converge'} in {p['compiles']} MaxText "
            f"compile(s) ({p['wall_s']:.0f} s); the file holds check {p['fitted_iteration']}'s plan"
        )
        mt = c.get("maxtext_train_compile")
        if mt is None:
            v += "; MaxText's own train_compile needs GPUs for a GPU target (not run)"
        elif "error" in mt:
            v += f"; MaxText's own train_compile of the file: REFUSED: `{mt['error'][:160]}`"
        else:
            limit = hbm_limit(c["target"])
            within = "within" if mt["peak_bytes"] <= limit else "ABOVE"
            v += (
                f"; MaxText's own train_compile of the file: compiled, peak "
                f"{_gib(mt['peak_bytes'])} GiB (arguments {_gib(mt['argument_size_in_bytes'])} + "
                f"temp {_gib(mt['temp_size_in_bytes'])}) {within} XLA:TPU's "
                f"{_gib(limit)} GiB, host temp "
                f"{_gib(mt['host_temp_size_in_bytes'])} GiB"
            )
        verdicts.append(v)
    return "\n".join(lines) + "\n\n" + "\n".join(verdicts) + f"\n\nCommand: `{doc['command']}`."


def main(argv=None) -> int:
    return _maxtext.run_cases(
        argv,
        doc=__doc__,
        out="maxtext_plan_check.json",
        schema=SCHEMA,
        marker=MARKER,
        cases=CASES,
        run_case=run_case,
        render=render,
    )


if __name__ == "__main__":
    sys.exit(main())
