#!/usr/bin/env python3
"""MaxText accepts what tierax emits: its own config loader parses the file, two tiny CPU steps run.

Not part of the default test suite (it installs MaxText, gigabytes, into a venv of its own).  Steps:

1. A Python 3.12 venv with ``maxtext[tpu]==VERSION`` (``--venv``, default
   ``~/.cache/tierax/maxtext-venv``; reused when present).  MaxText needs Python ≥ 3.12.
2. ``tierax plans --model M --show PLAN --emit maxtext --target cpu`` for each case: the
   overrides file (base_config: base.yml, the model keys, remat_policy: custom, sizes, mesh).
3. Fed back to tierax as ``--show FILE --yaml``: the same Plan (round trip).
4. MaxText's ``pyconfig.initialize`` on the file: every emitted key parses, unchanged.
5. ``python -m maxtext.trainers.pre_train.train FILE ... steps=2 dataset_type=synthetic``
   on CPU: "completed step" twice, exit 0.

Writes ``bench/results/maxtext_roundtrip.json``.  Exit 0 iff every case passed.
Run: ``.venv/bin/python bench/maxtext_roundtrip.py [--cases tiny-llama:qkv-offload,...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

import _common
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIERAX = [str(ROOT / ".venv" / "bin" / "tierax")]
CHECK = r"""
import json, sys
from maxtext.configs import pyconfig
path, want = sys.argv[1], json.loads(sys.argv[2])
cfg = pyconfig.initialize(["train", path, "run_name=check", "base_output_directory=" + sys.argv[3],
                           "dataset_type=synthetic", "enable_checkpointing=false",
                           "skip_jax_distributed_system=true"])
def norm(v):
    v = getattr(v, "value", v)  # enums
    if isinstance(v, (list, tuple)):
        return [norm(e) for e in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    try:
        import numpy as np
        return np.dtype(v).name  # jnp dtypes
    except TypeError:
        return str(v)
print(json.dumps({k: norm(getattr(cfg, k)) for k in want}))
"""


def sh(cmd, *, env=None, timeout=1800, cwd=None) -> _common.Run:
    return _common.run(cmd, env=env, timeout=timeout, cwd=cwd)


def python312() -> str:
    pyenv = sorted(
        pathlib.Path(os.path.expanduser("~/.pyenv/versions")).glob("3.1[2-9]*/bin/python3")
    )
    for c in [str(x) for x in pyenv] + ["python3.12", "python3.13"]:
        path = c if os.path.exists(c) else shutil.which(c)
        if (
            path
            and sh([path, "-c", "import sys; assert sys.version_info >= (3, 12)"]).returncode == 0
        ):
            return path
    sys.exit("no Python 3.12 found (MaxText needs ≥ 3.12); install one (e.g. pyenv install 3.12)")


def ensure_venv(venv: pathlib.Path, version: str) -> pathlib.Path:
    py = venv / "bin" / "python"
    if not py.exists():
        r = sh([python312(), "-m", "venv", str(venv)])
        if r.returncode:
            sys.exit(f"venv failed: {r.stderr[-2000:]}")
    if sh([str(py), "-c", "import maxtext"]).returncode:
        t = time.time()
        r = sh([str(py), "-m", "pip", "install", "-q", f"maxtext[tpu]=={version}"], timeout=3600)
        if r.returncode:
            sys.exit(f"pip install maxtext failed: {r.stderr[-3000:]}")
        print(f"installed maxtext {version} in {time.time() - t:.0f} s")
    return py


def run_case(py: pathlib.Path, model: str, plan: str, work: pathlib.Path, steps: int) -> dict:
    out = {"model": model, "plan": plan}
    f = work / f"{model}-{plan}.yml"
    r = sh(
        TIERAX
        + [
            "plans",
            "--model",
            model,
            "--show",
            plan,
            "--emit",
            "maxtext",
            "--target",
            "cpu",
            "--microbatch",
            "1",
            "--seq",
            "64",
        ]
    )
    if r.returncode:
        return {**out, "ok": False, "stage": "emit", "error": r.stderr.strip()}
    f.write_text(r.stdout)
    emitted = yaml.safe_load(r.stdout)
    a = sh(TIERAX + ["plans", "--model", model, "--show", plan, "--yaml"])
    b = sh(TIERAX + ["plans", "--model", model, "--show", str(f), "--yaml"])
    out["round_trip"] = (
        a.returncode == b.returncode == 0
        and yaml.safe_load(a.stdout)["groups"] == yaml.safe_load(b.stdout)["groups"]
    )
    env = {**os.environ, "DECOUPLE_GCLOUD": "TRUE", "JAX_PLATFORMS": "cpu"}
    want = {k: v for k, v in emitted.items() if k != "base_config"}
    c = sh(
        [str(py), "-c", CHECK, str(f), json.dumps(want), str(work / "out")],
        env=env,
        timeout=600,
        cwd=work,
    )
    if c.returncode:
        return {**out, "ok": False, "stage": "maxtext config", "error": c.stderr.strip()[-3000:]}
    got = json.loads(c.stdout.strip().splitlines()[-1])
    out["parsed_differ"] = {
        k: [want[k], got[k]]
        for k in want
        if got.get(k) != want[k]
        and not (isinstance(want[k], float) and abs(float(got[k]) - want[k]) < 1e-12)
    }
    t = time.time()
    s = sh(
        [
            str(py),
            "-m",
            "maxtext.trainers.pre_train.train",
            str(f),
            f"run_name={model}-{plan}",
            f"base_output_directory={work / 'out'}",
            "dataset_type=synthetic",
            f"steps={steps}",
            "enable_checkpointing=false",
            "skip_jax_distributed_system=true",
        ],
        env=env,
        timeout=1800,
        cwd=work,
    )
    log = s.stdout + s.stderr
    out["steps_completed"] = len(re.findall(r"completed step: \d+", log))
    out["train_s"] = round(time.time() - t, 1)
    out["train_rc"] = s.returncode
    out["ok"] = (
        out["round_trip"]
        and not out["parsed_differ"]
        and s.returncode == 0
        and out["steps_completed"] >= steps
    )
    if not out["ok"]:
        out["log_tail"] = log[-3000:]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", default=os.path.expanduser("~/.cache/tierax/maxtext-venv"))
    p.add_argument("--version", default="0.2.5")
    p.add_argument(
        "--cases", default="tiny-llama:qkv-offload,tiny-llama:minimal,tiny-deepseek:qkv-offload"
    )
    p.add_argument("--steps", type=int, default=2)
    _common.add_out(p, "maxtext_roundtrip.json")
    a = p.parse_args()
    py = ensure_venv(pathlib.Path(a.venv), a.version)
    version = sh([str(py), "-m", "pip", "show", "maxtext"]).stdout
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases.split(","):
            model, plan = case.split(":")
            r = run_case(py, model, plan, pathlib.Path(tmp), a.steps)
            print(json.dumps({k: v for k, v in r.items() if k != "log_tail"}))
            results.append(r)
    record = _common.envelope("tierax.maxtext_roundtrip/1") | {
        "maxtext": re.search(r"Version: (\S+)", version or "Version: ?").group(1),
        "cases": results,
    }
    _common.write_record(a.out, record)
    print(f"wrote {a.out}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
