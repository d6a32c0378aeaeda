"""MaxText's program in the bench scripts (maxtext_compile.py, maxtext_fidelity.py): its base
config, the environment its CPU-only compiles need, and a model file cut to a few layers.

Kept apart from ``_common`` so the GPU check (which imports ``_common``) needs no MaxText."""

from __future__ import annotations

import os
from collections.abc import Sequence


def base_yml() -> str:
    """The installed MaxText's ``configs/base.yml``."""
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")


def env(dump: str | os.PathLike | None = None) -> dict[str, str]:
    """This environment for a MaxText child on the host platform (no cloud, libtpu on localhost);
    with ``dump``, XLA writes its compiled modules there."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "DECOUPLE_GCLOUD": "TRUE",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    if dump is not None:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
    return env


def keys(model: str, layers: int, batch: int, seq: int, extra: Sequence[str]) -> list[str]:
    """MaxText keys for ``model`` cut to ``layers`` layers at a per-device batch and sequence."""
    return [
        f"model_name={model}",
        "override_model_config=true",  # MaxText's switch to override a key its model file sets
        f"base_num_decoder_layers={layers}",
        f"per_device_batch_size={batch}",
        f"max_target_length={seq}",
        *extra,
    ]
