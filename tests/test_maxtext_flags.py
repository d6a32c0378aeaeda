"""One program, stated: the libtpu/XLA flags tierax models MaxText's program under are the flags
``compile --maxtext`` compiles with by default, the flags ``plan --maxtext --check`` compiles
with, the flags ``--emit maxtext`` writes, and the flags ``simulate``/``plan --maxtext`` name on
stdout and in ``--json``.

The compile side is checked against MaxText's own ``train_compile`` run with the named flags in
its environment (tests/test_maxtext_compile.py); here the flags themselves, in this process where
no JAX backend is needed, and each verb's statement of them in a child process (one tiny trace).
"""

from __future__ import annotations

import argparse
import json

import maxtext_cli as M
import pytest

pytestmark = [M.requires_maxtext, M.programs_once]

WINDOWED = "--xla_tpu_enable_windowed_einsum_for_reduce_scatter=false"
MAXTEXT_OWN = "--xla_tpu_spmd_rng_bit_generator_unsafe=true"
TINY = [*M.TINY, "per_device_batch_size=2", "max_target_length=256"]


@pytest.mark.parametrize("target", ["v5e", "v5p", "v6e", "v7x", "h100", "h200", "gb200"])
@pytest.mark.parametrize("schedule", ["serial", "lhs", "lhs-pipelined"])
def test_the_modelled_flags_are_the_emitted_files_flags(target, schedule):
    """What simulate names is what --emit maxtext exports (with sizes given, which add only
    memory-fraction and host-limit variables), on every target and schedule."""
    from tierax.interop import maxtext as mt

    modelled = mt.modelled_flags(target, schedule)
    env, _ = mt.runtime_env(
        target=target,
        schedule=schedule,
        devices=8,
        budget_bytes=60 * 2**30,
        capacity_bytes=80 * 2**30,
        host_bytes=2**30,
    )
    assert modelled == {k: v for k, v in env.items() if k in mt.FLAG_VARIABLES}
    if target.startswith("v"):
        assert modelled == {"LIBTPU_INIT_ARGS": WINDOWED}
    else:
        assert "LIBTPU_INIT_ARGS" not in modelled
        assert bool(modelled) == (schedule != "serial")


@pytest.mark.parametrize("target", ["v5p", "h200"])
def test_compile_and_plan_check_compile_with_the_same_flags(target):
    """compile --maxtext's default flags are plan --maxtext --check's (issue 69: they disagreed
    on the same keys, only --check applied the libtpu flag); --maxtext-flags-only adds none."""
    from tierax.cli import maxtext_compile, maxtext_simulate

    args = argparse.Namespace(target=target, schedule="lhs", maxtext_flags_only=False)
    check_env, _ = maxtext_simulate._run_env(args, 4)
    assert maxtext_compile.program_flags(args) == check_env
    assert maxtext_compile.program_flags(args)  # both targets model a flag (TPU; GPU under lhs)
    args.maxtext_flags_only = True
    assert maxtext_compile.program_flags(args) == {}


def test_the_compile_environment_is_read_as_xla_reads_it():
    from tierax.xla.maxtext_step import compile_environment

    env = {"LIBTPU_INIT_ARGS": f" {MAXTEXT_OWN} {WINDOWED} ", "XLA_FLAGS": "--xla_dump_to=/d --a=1"}
    assert compile_environment(True, env) == {"LIBTPU_INIT_ARGS": f"{MAXTEXT_OWN} {WINDOWED}"}
    assert compile_environment(False, env) == {"XLA_FLAGS": "--a=1"}  # the dump is no flag of it
    assert compile_environment(False, {"XLA_FLAGS": "--xla_dump_to=/d"}) == {}
    assert compile_environment(True, {}) == {}


def test_the_compile_says_whether_it_compiled_the_modelled_program():
    from tierax.cli.maxtext_compile import flags_line

    modelled = {"LIBTPU_INIT_ARGS": WINDOWED}
    both = {"LIBTPU_INIT_ARGS": f"{MAXTEXT_OWN} {WINDOWED}"}
    assert "the flags simulate/plan --maxtext model" in flags_line(both, modelled, "v5p")
    assert "NOT" not in flags_line(both, modelled, "v5p")
    # the user's environment sets the flag otherwise (their value wins): not the modelled program
    theirs = {"LIBTPU_INIT_ARGS": f"{MAXTEXT_OWN} {WINDOWED[:-5]}true"}
    line = flags_line(theirs, modelled, "v5p")
    assert "NOT the program" in line and WINDOWED in line
    only = flags_line({"LIBTPU_INIT_ARGS": MAXTEXT_OWN}, {}, "v5p")
    assert "--maxtext-flags-only" in only and WINDOWED in only


def test_flags_only_without_maxtext_is_refused():
    r = M.tierax("compile", "--model", "tiny-llama", "--maxtext-flags-only", "--target", "v5p")
    assert r.returncode == 2 and "goes with --maxtext" in r.stderr, r.stderr[-2000:]


def test_simulate_and_plan_name_the_flags_they_model(cli):
    """simulate --maxtext names them on stdout and in --json; plan --maxtext in its notes and
    --json (a TPU target: the windowed-einsum flag).  In this process (``cli``: trace-only verbs,
    no backend flags to set; MaxText imported once, not three times)."""
    keys = [M.base_yml(), *TINY, "remat_policy=full", "--target", "v5p", "--devices", "4"]
    text = cli("simulate", "--maxtext", *keys)
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"flags modelled: export LIBTPU_INIT_ARGS={WINDOWED}" in text.stdout
    doc = M.json_of(cli("simulate", "--maxtext", *keys, "--json"))
    assert doc["maxtext"]["flags"] == {"LIBTPU_INIT_ARGS": WINDOWED}
    r = cli("plan", "--maxtext", *keys, "--no-check", "--json")
    plan = json.loads(r.stdout[r.stdout.index("{") :])
    assert plan["modelled_flags"] == {"LIBTPU_INIT_ARGS": WINDOWED}
    assert any(n.startswith("flags modelled: export LIBTPU_INIT_ARGS") for n in plan["notes"])
