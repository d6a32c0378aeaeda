"""One solve path (tierax.solving.planning.solve): ``tierax plan`` (plain, ``--sweep``,
``--check``), the
Python API and plan_check reach the planner only through it, with the options they were given."""

from __future__ import annotations

import json

import compiled_standin
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

import tierax
from tierax.errors import TieraxError
from tierax.solving import planner, planning

SIX = ["--model", "tiny-llama", "--set", "num_layers=6", "--microbatch", "8", "--seq", "64"]


@pytest.fixture
def solves(monkeypatch):
    """Every request planning.solve received; planner.plan called outside it fails the test."""
    seen, inside = [], []
    real_solve, real_plan = planning.solve, planner.plan

    def solve(req, *a, **k):
        seen.append(req)
        inside.append(True)
        try:
            return real_solve(req, *a, **k)
        finally:
            inside.pop()

    def plan(*a, **k):
        assert inside, "planner.plan reached without tierax.solving.planning.solve"
        return real_plan(*a, **k)

    monkeypatch.setattr(planning, "solve", solve)
    monkeypatch.setattr(planner, "plan", plan)
    return seen


def _main(monkeypatch, *args):
    from tierax import cli

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    return cli.main(list(args))


def test_plan_and_sweep_solve_the_same_request_with_segments(monkeypatch, capsys, solves):
    from gpu_budget import fixed_bytes

    # 21 MiB for the model's own buffers beside XLA:GPU's fixed bytes (by jaxlib release; 25 MiB
    # in all when those were 4 MiB)
    budget = str((fixed_bytes("h200") + 21 * 2**20) / 2**30)
    assert _main(monkeypatch, "plan", *SIX, "--budget-gib", budget, "--segments", "--json") == 0
    single = json.loads(capsys.readouterr().out)
    (plain,) = solves
    assert plain.segments and plain.microbatch == 8 and plain.budget_bytes == float(budget) * 2**30
    solves.clear()
    sweep = ["--sweep", "microbatch=4:8:4", "--budget-gib", budget, "--segments", "--json"]
    assert _main(monkeypatch, "plan", *SIX, *sweep) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    # One request per point, --segments carried, the swept value replacing --microbatch.
    assert [(r.segments, r.microbatch) for r in solves] == [(True, 4), (True, 8)]
    assert points[1]["step_time_s"] == single["predicted"]["step_time_s"]


@pytest.mark.parametrize(
    "extra", [["--check"], ["--emit", "maxtext"], ["--max-microbatch"], ["--for", "maxtext"]]
)
def test_sweep_refuses_single_plan_options_with_exit_2(monkeypatch, capsys, solves, extra):
    assert _main(monkeypatch, "plan", *SIX, "--sweep", "budget=1:2:1", *extra) == 2
    assert "--sweep solves one plan per point" in capsys.readouterr().err and not solves


def test_check_solves_each_iteration_through_the_same_path(monkeypatch, solves):
    from tierax import launch
    from tierax.xla import compile as compile_lib

    def xla(cfg, plan, target, *, microbatch, seq, mesh, grad_accum=1):
        return compiled_standin.compiled(1)

    monkeypatch.setattr(compile_lib, "compile_for_target", xla)
    monkeypatch.setattr(launch, "start", lambda **k: None)  # JAX runs already (conftest)
    assert _main(monkeypatch, "plan", *SIX, "--check", "--segments", "--check-iterations", "2") == 0
    # XLA's peak (1 byte) disagrees with the first prediction: a second solve with the (negative)
    # workspace correction, which agrees; its budget stays the device's usable memory (a correction
    # never plans beyond the device); --segments in both.
    assert len(solves) == 2 and all(r.segments for r in solves)
    assert solves[1].budget_bytes == solves[0].budget_bytes


def test_the_python_api_solves_through_the_same_path(solves):
    def layer(x, w):
        h = checkpoint_name(jnp.tanh(x @ w), "mlpwi_0")
        return x + h @ w.T

    def loss(params, x):
        import jax

        body = jax.checkpoint(lambda c, w: (layer(c, w), None))
        y, _ = jax.lax.scan(body, x, params["w"])
        return jnp.mean(y**2)

    params = {"w": jnp.ones((3, 16, 16))}
    planned = tierax.plan(tierax.inventory(loss, params, jnp.ones((4, 16))), mesh={"fsdp": 2})
    (req,) = solves
    assert req.mechanism == "policy" and req.program is not None and req.mesh["fsdp"] == 2
    assert planned.predicted.fits


def test_a_request_refuses_what_cannot_work_together():
    from tierax.models import get_config

    cfg = get_config("tiny-llama")
    with pytest.raises(TieraxError, match="--segments plans layer ranges"):
        planning.solve(planning.Request(cfg, {}, None, segments=True, max_microbatch=True))
    with pytest.raises(TieraxError, match="--for 'megatron' is not supported"):
        planning.solve(planning.Request(cfg, {}, None, for_tool="megatron"))
