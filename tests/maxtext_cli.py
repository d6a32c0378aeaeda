"""What the MaxText tests share: the mark that skips them without MaxText, a tiny llama2-block
config, MaxText's base config, the environment a MaxText child needs on the host platform, and the
tierax CLI run in a child process with it (its JSON read)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tierax.interop.maxtext_program.config import maxtext_importable

# The mark of every test module that needs MaxText (make test requires it: conftest.py).
requires_maxtext = pytest.mark.skipif(
    not maxtext_importable(),
    reason="MaxText is not installed (make venv installs it on Python >= 3.12; make test requires "
    "it)",
)

# The mark of the MaxText test modules whose programs are traced in the test process: each program
# built once there (conftest's maxtext_programs_once).
programs_once = pytest.mark.usefixtures("maxtext_programs_once")

# d 256, 4 query / 2 kv heads of 64, gated MLP 512, 2 layers, vocab 1024 (MaxText's llama2 block).
D, HEADS, KV, HD, MLP, LAYERS, VOCAB = 256, 4, 2, 64, 512, 2, 1024
TINY = [
    f"base_emb_dim={D}",
    f"base_num_query_heads={HEADS}",
    f"base_num_kv_heads={KV}",
    f"head_dim={HD}",
    f"base_mlp_dim={MLP}",
    f"base_num_decoder_layers={LAYERS}",
    f"vocab_size={VOCAB}",
]


def tiny_layer_params_per_device(fsdp: int) -> int:
    """TINY's layer parameters per device over ``fsdp`` ways: per layer q, k, v, out and the gated
    MLP's three kernels, sharded over fsdp; two norm scales, replicated."""
    sharded = D * HEADS * HD + 2 * D * KV * HD + HEADS * HD * D + 3 * D * MLP
    return LAYERS * (sharded // fsdp + 2 * D)


def tiny_outside_params_per_device(fsdp: int) -> int:
    """TINY's embedding and head, sharded over fsdp on emb; the final norm's scale, replicated."""
    return 2 * VOCAB * D // fsdp + D


def base_yml() -> str:
    """The installed MaxText's ``configs/base.yml``."""
    import maxtext

    return str(pathlib.Path(maxtext.__file__).parent / "configs" / "base.yml")


def env() -> dict:
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "DECOUPLE_GCLOUD": "TRUE",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }


def tierax(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``tierax ARGV`` in a child process (JAX started afresh there)."""
    return subprocess.run(
        [sys.executable, "-m", "tierax.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )


def json_of(out: subprocess.CompletedProcess) -> dict:
    """The JSON object a successful child printed: its whole stdout (what MaxText prints goes to
    stderr, so that ``--json`` pipes into another program)."""
    assert out.returncode == 0, out.stderr[-3000:]
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"stdout is not one JSON object:\n{out.stdout[:2000]}") from None


def compile_dumped(args: list[str], dump: pathlib.Path, timeout: float = 900) -> dict:
    """``tierax compile --maxtext ARGS --json`` in a child process with XLA's dump written to
    ``dump`` (its buffer assignment and live ranges: tests/xla_dump.py reads them); its JSON."""
    e = env()
    e["XLA_FLAGS"] = f"{e.get('XLA_FLAGS', '')} --xla_dump_to={dump}"
    argv = [sys.executable, "-m", "tierax.cli", "compile", "--maxtext", *args, "--json"]
    return json_of(subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e))
