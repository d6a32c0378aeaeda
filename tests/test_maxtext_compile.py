"""``tierax compile --maxtext``: MaxText's own train step compiled deviceless, read as tierax reads
its own.

The TPU figures are checked against MaxText's own ahead-of-time compiler
(``maxtext.trainers.pre_train.train_compile``, run as MaxText documents it) on the same config: the
same arguments, temp and host-temp bytes.  The GPU compile (MaxText's GPU path needs GPUs, so
tierax's compile-only devices stand in) is checked against a hand count of the training state.
A small llama2-style config keeps each compile to seconds."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import maxtext_cli as M
import pytest

pytestmark = M.requires_maxtext

# d 256, 4 query/kv heads of 64, gated MLP 512, 2 layers, vocab 1024 (MaxText's llama2 block).
TINY = [
    "base_emb_dim=256",
    "base_num_query_heads=4",
    "base_num_kv_heads=4",
    "head_dim=64",
    "base_mlp_dim=512",
    "base_num_decoder_layers=2",
    "vocab_size=1024",
]
SIZES = ["per_device_batch_size=1", "max_target_length=256"]


def _maxtext_train_compile(tmp_path, *keys: str, env: dict | None = None) -> dict[str, int]:
    """MaxText's own train_compile of ``keys`` (``env``: added to the child's environment): its
    printed CompiledMemoryStats."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "maxtext.trainers.pre_train.train_compile",
            M.base_yml(),
            "run_name=tierax-test",
            f"base_output_directory={tmp_path}",
            "dataset_type=synthetic",
            "enable_checkpointing=false",
            "skip_jax_distributed_system=true",
            f"jax_cache_dir={tmp_path / 'jax_cache'}",
            *keys,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=M.env() | (env or {}),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    stats = re.search(r"Memory analysis: CompiledMemoryStats\((.*)\)", out.stdout + out.stderr)
    assert stats, (out.stdout + out.stderr)[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stats.group(1))}


def test_tpu_compile_reads_the_figures_maxtexts_own_compiler_prints(tmp_path):
    """v5p-8 (4 devices), q/k/v offloaded by MaxText's own policy: tierax's reading of MaxText's
    step equals what MaxText's train_compile prints for the same config, host bytes included,
    train_compile run with the libtpu flags simulate names (compile --maxtext's default, which it
    states: MaxText's own libtpu option and those)."""
    from tierax.interop.maxtext import modelled_flags

    policy = "remat_policy=qkv_proj_offloaded"
    named = modelled_flags("v5p")
    theirs = _maxtext_train_compile(
        tmp_path, *TINY, *SIZES, policy, "compile_topology=v5p-8", "compile_topology_num_slices=1",
        env=named,
    )  # fmt: skip
    # tierax's compile of MaxText's policy, then of tierax's qkv-offload preset given as --plan:
    # one child process (one start of JAX for the v5p and one import of MaxText for both)
    sizes = ["--target", "v5p", "--devices", "4", "--microbatch", "1", "--seq", "256"]
    ours, planned = _tierax_jsons(
        ["compile", "--maxtext", M.base_yml(), *TINY, policy, *sizes],
        ["compile", "--maxtext", M.base_yml(), *TINY, "--plan", "qkv-offload", *sizes],
    )
    assert ours["device_argument_bytes"] == theirs["argument_size_in_bytes"]
    assert ours["device_temp_bytes"] == theirs["temp_size_in_bytes"]
    assert ours["device_alias_bytes"] == theirs["alias_size_in_bytes"]
    assert ours["host_temp_bytes"] == theirs["host_temp_size_in_bytes"] > 0  # q, k, v on host
    assert ours["fits"] and ours["mesh"]["fsdp"] == 4 and ours["plan"].endswith(policy[13:])
    assert ours["modelled_flags"] == named
    assert ours["xla_environment"]["LIBTPU_INIT_ARGS"].split() == [
        "--xla_tpu_spmd_rng_bit_generator_unsafe=true",  # train_compile's own
        *named["LIBTPU_INIT_ARGS"].split(),
    ]
    # q, k and v of both layers at [1, 256, 4 × 64] bf16 per device, stored and loaded back
    assert ours["overlap"]["transfers"] >= 2 * 3
    # tierax's qkv-offload preset given as --plan: set as MaxText's custom keys (q/k/v offloaded,
    # the rest recomputed), the program MaxText's qkv_proj_offloaded policy compiles
    assert planned["plan"] == "--plan qkv-offload (remat_policy=custom)"
    assert planned["device_argument_bytes"] == theirs["argument_size_in_bytes"]
    assert planned["device_temp_bytes"] == theirs["temp_size_in_bytes"]
    assert planned["host_temp_bytes"] == theirs["host_temp_size_in_bytes"]


def test_a_peak_over_the_limit_is_no_fit_on_a_tpu_either():
    from tierax.xla.maxtext_step import judged_fit

    assert judged_fit(100, 100, "0.0.50") == (True, None)
    assert judged_fit(101, 100, None) == (False, None)
    fits, note = judged_fit(101, 100, "0.0.50")
    assert not fits and "libtpu 0.0.50" in note and "not counted as fitting" in note


def test_gpu_compile_holds_the_training_state_counted_by_hand():
    """h200 × 4, fsdp: the arguments are MaxText's float32 parameters and AdamW's two float32
    moments (12 bytes a parameter), a quarter per device, plus the batch; cuDNN attention named for
    the deviceless compile, its calls found."""
    layer = 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256  # q, k, v, o; wi_0, wi_1, wo; two norms
    params = 2 * layer + 1024 * 256 + 256 * 1024 + 256  # layers, embedding, head, final norm
    r = _tierax_json(
        "compile",
        "--maxtext",
        M.base_yml(),
        *TINY,
        "remat_policy=full",
        "--target",
        "h200",
        "--devices",
        "4",
        "--microbatch",
        "1",
        "--seq",
        "256",
    )
    state = 12 * params / 4
    assert state < r["device_argument_bytes"] < state * 1.01
    assert r["attention"] == "cudnn_flash_jax" and r["cudnn_calls"] >= 2
    assert r["cudnn_workspace_bytes"] == 4 * 1 * 4 * 256 * (64 + 1) + 256
    assert r["fits"] and r["host_temp_bytes"] == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "tiny-llama"], "--maxtext and --model both given"),
        (["remat_policy=full", "--plan", "save-all"], "remat_policy=full is given too"),
        (["--plan", "full"], "remat_policy=full"),
        (["--xla-preset", "lhs"], "leave --xla-preset out"),
        (["hardware=tpu", "--target", "h200"], "hardware=gpu, but hardware=tpu is given too"),
        (["--target", "v5p", "--devices", "3"], "MaxText has no v5p slice of 3 devices"),
    ],
)
def test_bad_input_is_refused_before_compiling(argv, message):
    out = M.tierax("compile", "--maxtext", M.base_yml(), *TINY, *argv)
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr


def test_overrides_without_maxtext_are_refused():
    out = M.tierax("compile", "--model", "tiny-llama", "remat_policy=full")
    assert out.returncode == 2 and "given without --maxtext" in out.stderr


def _tierax_json(*argv: str) -> dict:
    return M.json_of(M.tierax(*argv, "--json", timeout=600))


# tierax's command line run once for each argv (a JSON list of them) in one process; a line of JSON
# for each: its exit code and what it printed on stdout.
_SEVERAL = r"""
import contextlib, io, json, sys
from tierax.cli import main
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    print(json.dumps({"code": code, "stdout": out.getvalue()}), flush=True)
"""


def _tierax_jsons(*argvs: list[str]) -> list[dict]:
    """``tierax ARGV --json`` for each argv, in turn in one child process: each one's JSON (its
    whole stdout, as :func:`maxtext_cli.json_of` reads it)."""
    p = subprocess.run(
        [sys.executable, "-c", _SEVERAL, json.dumps([[*a, "--json"] for a in argvs])],
        capture_output=True, text=True, timeout=600, env=M.env(),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    runs = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["code"] for r in runs] == [0] * len(argvs), p.stderr[-3000:]
    return [json.loads(r["stdout"]) for r in runs]
