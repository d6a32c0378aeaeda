"""Budgets a new user gives ``tierax plan`` (issue 60, items 8 and 9 and the no-fit hints): a host
budget above the target's host memory is refused before any work; when the host budget is what
binds, the no-fit message names it; the hints are true (applying one makes the plan fit) and never
suggest what cannot help (a larger device budget at the maximum)."""

from __future__ import annotations

import re

import pytest

import tierax
from tierax.errors import TieraxError

LLAMA = ("--model", "llama3-8b", "--target", "h200", "--microbatch", "4", "--seq", "8192")
# H200: 256 GB of host memory per GPU (the target table's system datasheet figure)
H200_HOST_GIB = 256e9 / 2**30


def test_host_budget_above_the_hosts_memory_is_refused_before_anything_is_written(cli, tmp_path):
    out = tmp_path / "p.yaml"
    r = cli("plan", *LLAMA, "--host-budget-gib", "5000", "--out", out)
    assert r.returncode == 2
    assert "--host-budget-gib 5000 is more than h200's host memory per device" in r.stderr
    assert f"{H200_HOST_GIB:.2f} GiB" in r.stderr
    assert f"give --host-budget-gib {int(H200_HOST_GIB * 100) / 100:.2f} or less" in r.stderr
    assert not out.exists()
    # the largest it names is accepted
    ok = cli("plan", *LLAMA, "--host-budget-gib", f"{int(H200_HOST_GIB * 100) / 100:.2f}")
    assert ok.returncode == 0, ok.stderr
    # --rate host_memory models a larger host: then the budget is accepted
    more = cli("plan", *LLAMA, "--host-budget-gib", "300", "--rate", "host_memory=400")
    assert more.returncode == 0, more.stderr


def test_api_refuses_a_host_budget_above_the_hosts_memory():
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    def loss(params, x):
        def body(c, p):
            layer = jax.checkpoint(lambda c, p: c + checkpoint_name(jnp.tanh(c @ p), "mlpwo"))
            return layer(c, p), None

        return jnp.mean(jax.lax.scan(body, x, params)[0] ** 2)

    params = jax.ShapeDtypeStruct((2, 16, 16), jnp.float32)
    inv = tierax.inventory(loss, params, jax.ShapeDtypeStruct((4, 8, 16), jnp.float32))
    with pytest.raises(TieraxError, match=r"host_budget=\d+ is more than h200's host memory"):
        tierax.plan(inv, target="h200", host_budget=5000 * 2**30)
    assert tierax.plan(inv, target="h200", host_budget=60 * 2**30).predicted.fits


def test_a_binding_host_budget_is_named(cli):
    r = cli("plan", *LLAMA, "--host-budget-gib", "60")
    assert r.returncode == 2
    assert "in a host budget of 60.00 GiB per device" in r.stderr
    assert "the host budget binds" in r.stderr and "--host-budget-gib" in r.stderr
    # true: the device floor alone fits, so the full host memory makes a plan
    assert cli("plan", *LLAMA).returncode == 0
    # and the state kept on device does not fit the device at all (the figure it names)
    floor = re.search(r"Recomputing everything needs ([\d.]+) GiB", r.stderr)
    assert floor and float(floor.group(1)) * 2**30 > 133.95 * 2**30
    on_device = cli("plan", *LLAMA, "--state-on-device")
    assert on_device.returncode == 2
    assert f"still needs {floor.group(1)} GiB" in on_device.stderr


def test_no_larger_device_budget_suggested_at_the_maximum(cli):
    r = cli("plan", *LLAMA, "--state-on-device")
    assert r.returncode == 2
    assert "--budget-gib" not in r.stderr
    assert "already h200's usable maximum" in r.stderr
    # the state hint names the option to drop, and dropping it makes a plan
    assert "without --state-on-device the planner may also offload the training state" in r.stderr
    assert cli("plan", *LLAMA).returncode == 0
    # below the maximum a larger --budget-gib is still a way out, and no state hint without it
    low = cli("plan", *LLAMA, "--budget-gib", "60")
    assert low.returncode == 2 and "a larger --budget-gib" in low.stderr
    assert "--state-on-device" not in low.stderr


def test_loss_tiles_hint_is_the_fewest_tiles_that_fit(cli):
    # tiny-llama with a 32000 vocabulary: the logits make the peak at the loss
    base = ("plan", "--set", "vocab_size=32000", "--budget-gib", "0.1", "--state-on-device")
    r = cli(*base)
    assert r.returncode == 2
    m = re.search(r"--set loss_tiles=(\d+) computes it in \d+ tiles", r.stderr)
    assert m, r.stderr
    n = int(m.group(1))
    assert cli(*base, "--set", f"loss_tiles={n}").returncode == 0
    if n > 2:  # the fewest: half as many do not fit
        assert cli(*base, "--set", f"loss_tiles={n // 2}").returncode == 2
    # no hint where tiling cannot fit (the layer phase alone exceeds the budget)
    tight = cli("plan", "--set", "vocab_size=32000", "--budget-gib", "0.01", "--state-on-device")
    assert tight.returncode == 2 and "loss_tiles" not in tight.stderr


def test_small_budgets_are_shown_in_mib(cli, tmp_path):
    from tierax import costmodel as cm

    out = tmp_path / "p.yaml"
    # a budget of a few tens of MiB in which tiny-llama 8 × 64 fits on an H200 (the default
    # target): XLA:GPU's fixed bytes plus 7.47 MiB (the model needs about 5.7 MiB beyond them
    # under remat-full), given in GiB with four decimals
    fixed = cm.target_rates("h200", "float32").fixed_device_bytes
    gib = f"{(fixed + 7.47 * 2**20) / 2**30:.4f}"
    r = cli("plan", "--budget-gib", gib, "--out", out)
    assert r.returncode == 0, r.stderr
    # e.g. 0.0112 GiB = 11.47 MiB (not "0.0 GiB")
    assert f"device budget {float(gib) * 1024:.2f} MiB" in out.read_text()
    from tierax.interop.maxtext import runtime_env

    # 4.6 MiB of a 141 GB device: the memory-fraction note says MiB
    _, why = runtime_env(target="h200", schedule="lhs", devices=1, budget_bytes=4.6 * 2**20,
                         capacity_bytes=141e9)  # fmt: skip
    assert any("device budget 4.6 MiB of" in w for w in why), why
