"""Splash attention (the Pallas TPU kernel) on the CPU: Pallas's interpreter runs the same kernel
as a TPU compiles, so its values and gradients are checked here against ``xla`` attention, the
materialising reference.  Its deviceless TPU compile is in tests/test_tpu.py."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tierax import launch
from tierax.errors import TieraxError
from tierax.models import for_platform, get_config
from tierax.models.attention import causal_attention, splash_attention, xla_attention


def _inputs(K, G, d, dv, S=256, B=1, seed=0):
    # standard normal float32 drawn by NumPy (jax.random compiles a program for every shape)
    rng = np.random.default_rng(seed)
    q, k, v, w = (
        jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
        for shape in ((B, S, K, G, d), (B, S, K, d), (B, S, K, dv), (B, S, K, G, dv))
    )  # w: a cotangent with no symmetry
    return q, k, v, w


@pytest.mark.parametrize(
    "K, G, d, dv, documents",
    [
        (2, 2, 64, 64, False),  # grouped-query: 2 query heads per kv head (Llama)
        (2, 1, 96, 64, False),  # q/k head dim above v's (MLA's 192/128, scaled down): v padded
        (2, 2, 64, 64, True),  # packed documents: the kernel's segment ids
    ],
)
def test_splash_equals_xla_attention_in_values_and_gradients(K, G, d, dv, documents):
    q, k, v, w = _inputs(K, G, d, dv)
    S = q.shape[1]
    seg = (jnp.arange(S)[None, :] >= 100).astype(jnp.int32) if documents else None

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v) * w)

    def splash(q, k, v):
        return splash_attention(q, k, v, seg, interpret=True)

    def ref(q, k, v):
        return xla_attention(q, k, v, seg)

    assert jnp.allclose(splash(q, k, v), ref(q, k, v), atol=2e-5, rtol=1e-5)
    g_splash = jax.grad(loss(splash), argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_splash, g_ref, strict=True):
        assert jnp.allclose(a, b, atol=5e-5, rtol=1e-5), float(jnp.max(jnp.abs(a - b)))


def test_splash_stand_in_equals_xla_attention():
    """``splash_blockwise`` (what host traces run for ``splash``) is the same function."""
    q, k, v, _ = _inputs(2, 1, 96, 64)
    out = causal_attention(q, k, v, impl="splash_blockwise")
    assert jnp.allclose(out, xla_attention(q, k, v), atol=2e-5, rtol=1e-5)


def test_splash_refuses_a_sequence_the_kernel_cannot_tile():
    q, k, v, _ = _inputs(1, 1, 64, 64, S=200)
    with pytest.raises(ValueError, match="multiple of 128 \\(got 200\\).*attention=blockwise"):
        splash_attention(q, k, v, interpret=True)


def test_auto_is_splash_on_a_tpu_and_splash_runs_on_tpus_only():
    cfg = get_config("llama3-8b")
    assert for_platform(cfg, "tpu").attention == "splash"
    assert for_platform(cfg, "tpu", documents=True).attention == "splash"  # segment ids
    assert for_platform(get_config("deepseek-v3-671b"), "tpu").attention == "splash"
    splash = for_platform(cfg, "tpu")
    with pytest.raises(TieraxError, match="splash-attention kernel on TPUs only.*backend is cpu"):
        launch.local_attention(splash, what="bench")


def test_bench_and_train_with_splash_on_the_cpu_exit_2_naming_what_runs(
    cli, console_script, tmp_path
):
    r = cli("bench", "--model", "tiny-llama", "--set", "attention=splash")
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "splash-attention kernel on TPUs only" in r.stderr
    assert "xla, blockwise" in r.stderr  # what runs on this backend
    demo = pathlib.Path(__file__).resolve().parents[1] / "configs" / "demo-train.yaml"
    out = tmp_path / "run"
    r = console_script(  # train starts its own backend: a process of its own
        "train",
        str(demo),
        "model=tiny-llama",
        "model.attention=splash",
        f"log.dir={out}/log",
        f"checkpoint.dir={out}/ckpt",
    )
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "tierax train: attention=splash runs the Pallas splash-attention kernel on TPUs" in (
        r.stderr
    )
    assert not out.exists()  # refused before anything is written


def test_compile_refuses_a_sequence_splash_cannot_tile(console_script):
    r = console_script(  # a TPU compile starts libtpu at start-up: a process of its own
        "compile",
        "--model",
        "tiny-llama",
        "--set",
        "attention=splash",
        "--target",
        "v5e",
        "--devices",
        "1",
        "--seq",
        "200",
    )
    assert r.returncode == 2 and "multiple of 128 (got 200)" in r.stderr, r.stderr[-2000:]
