"""XLA options are set once, before the backend starts (conftest did it for this session)."""

import jax
import pytest

from tierax import launch, xla_flags
from tierax.errors import TieraxError


def test_options_already_in_effect_are_not_an_error(monkeypatch):
    """A command that only asks for the CPU platform the running backend already uses (the CLI's
    `plan` when
    no JAX_PLATFORMS is set and there is no NVIDIA driver) changes nothing, so it must not fail."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    jax.numpy.zeros(1).block_until_ready()  # the backend is running
    assert jax.config.jax_platforms == "cpu"
    assert xla_flags.configure(platforms="cpu") == []
    launch.start()  # what `tierax plan` calls first


@pytest.mark.parametrize(
    "kwargs",
    [{"preset": "lhs"}, {"cpu_devices": 4}, {"platforms": "cuda"}, {"dump_dir": "/tmp/xla-dump"}],
)
def test_options_that_would_change_a_running_backend_are_refused(kwargs):
    jax.numpy.zeros(1).block_until_ready()
    with pytest.raises(TieraxError, match="must be set before JAX starts its backend"):
        xla_flags.configure(**kwargs)
