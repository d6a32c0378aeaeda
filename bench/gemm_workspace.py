#!/usr/bin/env python3
"""XLA:GPU's GEMM workspace in deviceless compiles, by compute capability and jaxlib release.

The cost model's fixed GPU bytes (tierax.costmodel.rates.xla_gpu_fixed_bytes) follow from the size
of the cuBLAS workspace XLA:GPU gives its GEMMs.  Two programs, compiled for GPU targets on this
CPU machine with the flags tierax's deviceless compiles use (Triton GEMMs off):

* a probe free of tierax: the gradient of a scanned, rematted 4-layer float32 MLP (weights stacked
  [4, 1024, 1024], batch 2048) for compute capabilities 8.0, 8.9, 9.0, 10.0 and 12.0 (the H100
  target config with its capability replaced).  Each case records the workspace sizes of its cuBLAS
  calls (the ``s8[N]`` element of each call's result), how many dynamic-slice fusions XLA made and
  the temp bytes.  ``--python PY`` runs it under another interpreter (another jaxlib) as well;
* tiny-llama remat-full (8 × 64, one device) through ``tierax compile`` for h100, h200, b200 and
  gb200 (the installed jaxlib only): the same workspace sizes, XLA's peak and the model's.

The record keeps one entry per jaxlib release (a rerun replaces its own release's entry).  Writes
bench/results/gemm_workspace.json.

    .venv/bin/python bench/gemm_workspace.py [--python OTHER_VENV/bin/python ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

CAPABILITIES = [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)]
TARGETS = ["h100", "h200", "b200", "gb200"]
DEVICELESS_FLAG = "--xla_gpu_enable_triton_gemm=false"


def workspaces(hlo_text: str) -> dict[str, int]:
    """{workspace bytes: cuBLAS calls} of a compiled module's text (each call's ``s8[N]``)."""
    out: dict[str, int] = {}
    for line in hlo_text.splitlines():
        if 'custom_call_target="__cublas' not in line or "custom-call(" not in line:
            continue
        for size in re.findall(r"s8\[(\d+)\]", line.split("custom-call(")[0]):
            out[size] = out.get(size, 0) + 1
    return out


def probe(target_config: str) -> dict:
    """The tierax-free probe under this interpreter's jaxlib (see the module docstring)."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICELESS_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICELESS_FLAG}".strip()
    import importlib.metadata

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    def loss(ws, x):
        def layer(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(jax.checkpoint(layer), x, ws)
        return jnp.sum(h * h)

    cases = {}
    for major, minor in CAPABILITIES:
        block = f"cuda_compute_capability {{\n    major: {major}\n" + (
            f"    minor: {minor}\n  }}" if minor else "  }"
        )
        text = re.sub(r"cuda_compute_capability \{[^}]*\}", block, target_config)
        topo = topologies.get_topology_desc(platform="cuda", target_config=text, topology="1x1x1")
        s = NamedSharding(Mesh(np.array(topo.devices), ("d",)), PartitionSpec())
        ws = jax.ShapeDtypeStruct((4, 1024, 1024), jnp.float32, sharding=s)
        x = jax.ShapeDtypeStruct((2048, 1024), jnp.float32, sharding=s)
        compiled = jax.jit(jax.grad(loss)).trace(ws, x).lower(lowering_platforms=("cuda",))
        compiled = compiled.compile()
        hlo = compiled.as_text()
        cases[f"{major}.{minor}"] = {
            "workspaces": workspaces(hlo),
            "dynamic_slice_fusions": len(re.findall(r"^%dynamic-slice-fusion", hlo, flags=re.M)),
            "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
        }
    return {
        "jaxlib": importlib.metadata.version("jaxlib"),
        "xla_flags": os.environ["XLA_FLAGS"],
        "probe": cases,
    }


def tiny_llama(target: str) -> dict:
    """tiny-llama remat-full on one ``target`` GPU through tierax's compile: workspaces, XLA's peak
    and the cost model's (the installed jaxlib)."""
    from tierax import costmodel as cm
    from tierax import plan as P
    from tierax.models import for_platform, get_config
    from tierax.tracing.inventory import model_inventory
    from tierax.tracing.model_program import for_inventory
    from tierax.xla import compile as C

    cfg = for_platform(get_config("tiny-llama"), "gpu")
    plan = P.preset("remat-full", cfg)
    got, hlo = C.compile_for_target(cfg, plan, target, microbatch=8, seq=64)
    rates = cm.target_rates(target, cfg.dtype)
    pred = cm.simulate(plan, for_inventory(cfg, model_inventory(cfg, 8, 64)), rates, "lhs")
    return {
        "workspaces": workspaces(hlo),
        "xla_peak_bytes": got.device_peak_bytes,
        "predicted_peak_bytes": pred.peak_device_bytes,
        "fixed_device_bytes": rates.fixed_device_bytes,
        "error": pred.peak_device_bytes / got.device_peak_bytes - 1,
    }


def main() -> int:
    if sys.argv[1:2] == ["--probe"]:  # the child: no tierax here (another venv's jaxlib)
        print(json.dumps(probe(sys.stdin.read())))
        return 0
    import _common

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--python",
        action="append",
        default=[],
        help="another interpreter (with jax, jaxlib, jax-cuda13-plugin/pjrt and ptxas) to run the "
        "probe under too (repeatable)",
    )
    ap.add_argument(
        "--out", type=_common.out_path, default=str(_common.RESULTS / "gemm_workspace.json")
    )
    args = ap.parse_args()
    for py in args.python:
        if not os.access(py, os.X_OK):
            ap.error(f"--python {py!r} is not an executable interpreter")

    from tierax.launch import flags as xla_flags

    xla_flags.configure(deviceless_gpu=True)
    from tierax import hardware
    from tierax.costmodel import xla_gpu_fixed_bytes
    from tierax.hardware.target_config import render_target_config

    config = render_target_config(hardware.get_target("h100"))
    doc = _common.envelope("tierax.bench.gemm_workspace/1") | {
        "note": "each --python: a Python 3.12 venv with jax, jaxlib, jax-cuda13-plugin and "
        "jax-cuda13-pjrt at one release, and nvidia-cuda-nvcc and nvidia-nvvm (pip); "
        "rule_bytes: tierax.costmodel.xla_gpu_fixed_bytes at that release and capability"
    }
    try:
        with open(args.out) as f:
            old = json.load(f).get("releases", {})
    except (OSError, ValueError):
        old = {}
    releases = dict(old)
    for py in [sys.executable, *args.python]:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        child = subprocess.run(
            [py, __file__, "--probe"],
            input=config,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if child.returncode:
            print(child.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"the probe failed under {py}")
        got = json.loads(child.stdout.strip().splitlines()[-1])
        for cc, case in got["probe"].items():  # the largest workspace beside the rule's
            case["largest_workspace"] = max(map(int, case["workspaces"]), default=0)
            capability = tuple(int(p) for p in cc.split("."))
            case["rule_bytes"] = xla_gpu_fixed_bytes(capability, got["jaxlib"])
        releases[got["jaxlib"]] = got
        print(got["jaxlib"], json.dumps(got["probe"]))
    installed = _common.versions("jaxlib")["jaxlib"]
    releases[installed]["tiny_llama_remat_full"] = {t: tiny_llama(t) for t in TARGETS}
    for t, r in releases[installed]["tiny_llama_remat_full"].items():
        print(t, r)
    doc["releases"] = dict(sorted(releases.items(), key=lambda kv: _release(kv[0])))
    return _common.finish(args.out, doc)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


if __name__ == "__main__":
    raise SystemExit(main())
