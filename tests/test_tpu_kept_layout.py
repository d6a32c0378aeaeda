"""Kept residuals of the prefetching scans are laid out row-major where they are produced.

On XLA:TPU (v6e, 8 chips, fsdp=8) the windowed-einsum all-gather of Llama 3 8B's up-projections
gives the kept mlpwi_0/mlpwi_1 values a tokens-minor layout, while the prefetching scan's backward
reads the stacked residuals row-major: XLA then copied each whole stack (bf16[32, 1, 4096, 14336],
3.76e9 bytes each) at the step's peak and refused the planner's 1 × 4096 plan for 31.25 GiB
(bench/results/tpu_default_env_v6e.json).  tierax.models.prefetch constrains the kept values
row-major before they are stacked.

* on CPU: the traced forward of both scans constrains exactly the kept values, row-major;
* with libtpu (slow): that step compiles and fits (``tierax compile`` says so although libtpu
  0.0.42.1's memory_analysis() reports more than the limit), its buffer assignment holds no copy of
  the kept stacks, and its preallocated temp plus the live arguments are within XLA:TPU's limit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from tierax.models.prefetch import Part, prefetch_scan, segmented_scan
from tierax.models.tags import tag

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def _layer(x, p):
    """Offloaded query_proj is [4, 8]; kept mlpwi_0 is [4, 16] (told apart by shape)."""
    q = tag(jnp.tanh(x @ p["wq"]), "query_proj")
    h = tag(jnp.concatenate([q, x], axis=-1), "mlpwi_0")
    return x + jnp.sin(h @ p["wo"])


def _params(n_layers=3, d=8):
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    rng = np.random.default_rng(0)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

    return (
        {
            "wq": normal(n_layers, d, d) / d,
            "wo": normal(n_layers, 2 * d, d) / d,
        },
        normal(4, d),
    )


def _constraints(jaxpr) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(operand shape, major_to_minor) of every layout_constraint in ``jaxpr`` and its
    sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "layout_constraint":
            found.append(
                (tuple(eqn.invars[0].aval.shape), tuple(eqn.params["layout"].major_to_minor))
            )
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _constraints(sub)
    return found


def _run(scan: str):
    """The prefetching scan (mlpwi_0 kept, query_proj offloaded), or a segmented scan whose two
    parts both keep mlpwi_0."""
    if scan == "prefetch":
        return prefetch_scan(_layer, keep={"mlpwi_0"}, offload={"query_proj"})
    parts = (
        Part(0, 2, keep=frozenset({"mlpwi_0"}), offload=frozenset({"query_proj"})),
        Part(2, 3, keep=frozenset({"mlpwi_0"})),
    )
    return segmented_scan(_layer, parts)


@pytest.mark.parametrize("scan", ["prefetch", "segmented"])
def test_the_forward_constrains_exactly_the_kept_values_row_major(scan):
    params, x0 = _params()
    run = _run(scan)
    jaxpr = jax.make_jaxpr(lambda x, p: jax.vjp(run, x, p)[0])(x0, params).jaxpr
    want = [((4, 16), (0, 1))] * (1 if scan == "prefetch" else 2)  # one per part that keeps
    assert _constraints(jaxpr) == want


def _lowered_constraints(scan: str, platform: str) -> int:
    """LayoutConstraint custom calls in the gradient step's StableHLO lowered for ``platform``
    (no device of that kind is needed to lower)."""
    params, x0 = _params()
    run = _run(scan)
    step = jax.jit(jax.grad(lambda x, p: run(x, p).sum(), argnums=(0, 1)))
    text = step.trace(x0, params).lower(lowering_platforms=(platform,)).as_text()
    return len(re.findall(r"custom_call\s*@LayoutConstraint", text))


@pytest.mark.parametrize("scan", ["prefetch", "segmented"])
def test_only_a_tpu_lowering_constrains_the_kept_layout(scan):
    """XLA:GPU keeps its own layouts: the constraint raised the device peak of DeepSeek-V3's
    mesh-search winner on 128 GB200 past its capacity in a deviceless compile (the compile in
    bench/results/mesh_search.json fits without it)."""
    assert _lowered_constraints(scan, "tpu") == (1 if scan == "prefetch" else 2)
    assert _lowered_constraints(scan, "cuda") == 0


# The planner's plan for Llama 3 8B on 8 v6e at 1 × 4096 (bench/results/tpu_default_env_v6e.json).
V6E_PLAN = """plan: planned-v6e-1x4096
groups:
  decoder:
    default: remat
    decoder_layer_input: device
    query_proj: device
    key_proj: device
    value_proj: device
    attention_out: remat
    out_proj: offload
    mlpwi_0: device
    mlpwi_1: device
    mlpwo: device
"""


@pytest.mark.slow  # ~80 s: a full-size Llama 3 8B compiled deviceless for 8 v6e chips
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (the tpu-aot extra)")
def test_v6e_planned_step_compiles_without_copies_of_the_kept_stacks(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(V6E_PLAN)
    dump = tmp_path / "dump"
    p = subprocess.run(
        [
            sys.executable, "-m", "tierax.cli", "compile", "--model", "llama3-8b",
            "--target", "v6e", "--devices", "8", "--mesh", "fsdp=8", "--microbatch", "1",
            "--seq", "4096", "--plan", str(plan), "--json",
        ],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        env={**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert not r["out_of_memory"] and r["fits"], r["notes"]
    if r["device_peak_bytes"] > r["device_limit_bytes"]:  # libtpu 0.0.42.1's memory_analysis()
        assert any("assigned the program's buffers within the limit" in n for n in r["notes"])
    (found,) = sorted(dump.glob("*jit_step*after_optimizations-buffer-assignment.txt"))[-1:]
    text = pathlib.Path(found).read_text()
    copies = set(
        re.findall(r"value: <\d+ (copy[\w.]*) @\d+> \([^)]*\): bf16\[32,1,4096,14336\]", text)
    )
    assert not copies, f"XLA copies the kept up-projection stacks: {sorted(copies)}"
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
    from _common import preallocated_temp  # XLA:TPU's dump read as the TPU bench scripts read it

    heap = preallocated_temp(dump)["preallocated_temp_bytes"]
    live = r["device_argument_bytes"] + r["device_output_bytes"] - r["device_alias_bytes"]
    assert live + heap <= r["device_limit_bytes"]
