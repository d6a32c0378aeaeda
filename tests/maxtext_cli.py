"""What the MaxText tests share: MaxText's base config, the environment a MaxText child needs on the
host platform, and the tierax CLI run in a child process with it (its JSON read)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys


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
    """The JSON object a successful child printed (MaxText may print lines before it)."""
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout[out.stdout.index("{") :])
