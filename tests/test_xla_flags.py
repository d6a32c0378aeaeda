"""XLA options are set once, before the backend starts (conftest did it for this session)."""

import jax
import pytest

from tierax import launch
from tierax.errors import TieraxError
from tierax.launch import flags as xla_flags


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


def test_libtpu_gets_the_step_flags_ahead_of_the_users_and_a_users_own_value_wins():
    flag = "--xla_tpu_enable_windowed_einsum_for_reduce_scatter"
    assert xla_flags.libtpu_env({}) == {"LIBTPU_INIT_ARGS": f"{flag}=false"}
    # the user's other flags are kept, after ours
    mine = "--xla_tpu_enable_data_parallel_all_reduce_opt=true"
    args = xla_flags.libtpu_env({"LIBTPU_INIT_ARGS": mine})["LIBTPU_INIT_ARGS"]
    assert args.split() == [f"{flag}=false", mine]
    # a value the user chose for the same flag is not replaced (nothing to add)
    assert xla_flags.libtpu_env({"LIBTPU_INIT_ARGS": f"{flag}=true"}) == {}


def test_a_deviceless_tpu_compile_hands_libtpu_the_step_flags(monkeypatch):
    """``start_deviceless_tpu`` puts the TPU flags in the environment libtpu reads."""

    seen = {}
    monkeypatch.setattr(xla_flags, "configure", lambda **kw: seen.update(kw))
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    launch.start_deviceless_tpu()
    assert seen["env"]["LIBTPU_INIT_ARGS"].split() == list(xla_flags.TPU_FLAGS)
