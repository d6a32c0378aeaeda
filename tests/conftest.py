"""Strict test setup: 8 host CPU devices (FSDP meshes), deviceless GPU compiles, rank promotion
raises."""

from tierax import xla_flags

# Must run before any JAX operation: the one place tierax sets backend options.
xla_flags.configure(cpu_devices=8, deviceless_gpu=True)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="session")
def tiny_names():
    return ["tiny-llama", "tiny-deepseek"]
