#!/usr/bin/env python3
"""Plan a plain-JAX model (no framework) with tierax's Python API, and check the gradients.

A residual SwiGLU-MLP stack: ``lax.scan`` over ``jax.checkpoint(layer, policy=...)``,
activations tagged with tierax's (= MaxText's) names.  The policy comes from the plan::

    inv = tierax.inventory(loss_fn(None), params, x)
    planned = tierax.plan(inv, target="h200", budget=...)
    grads = jax.grad(loss_fn(planned.policy()))(params, x)

Run: ``.venv/bin/python examples/jax_scan_model.py [--squeeze 0.9 | --budget-mib 55] [--compile-for
h200]``. ``--compile-for`` also compiles the planned gradient step for that GPU without a GPU
(deviceless XLA:GPU; needs tierax's gpu-aot extra) and prints XLA's memory figures.  (For the
lower-level calls this API wraps, see examples/custom_model.py.)  A budget no plan fits (below
about 54 MiB at these sizes, 32 MiB of it XLA:GPU's cuBLAS workspace; 26 MiB under a jaxlib before
0.11.1, whose workspace here is 4 MiB) is reported in one line, exit 2.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

import tierax  # noqa: E402


def layer(x, p):
    gate = checkpoint_name(x @ p["wi_0"], "mlpwi_0")
    up = checkpoint_name(x @ p["wi_1"], "mlpwi_1")
    return x + checkpoint_name((jax.nn.silu(gate) * up) @ p["wo"], "mlpwo")


def loss_fn(policy):
    def loss(params, x):
        def body(h, p):
            return jax.checkpoint(layer, policy=policy, prevent_cse=False)(h, p), None

        with jax.named_scope("tierax_group_mlp"):
            y, _ = jax.lax.scan(body, x, params)
        return jnp.mean(y**2)

    return loss


def init(layers=6, d=128, f=512, batch=4, seq=64):
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "wi_0": jax.random.normal(k[0], (layers, d, f)) / d**0.5,
        "wi_1": jax.random.normal(k[1], (layers, d, f)) / d**0.5,
        "wo": jax.random.normal(k[2], (layers, f, d)) / f**0.5,
    }
    return params, jax.random.normal(k[3], (batch, seq, d))


def run(budget=None, target="h200", squeeze=None, **sizes) -> dict:
    """Inventory, plan (``squeeze``: budget = XLA:GPU's fixed buffers plus that fraction of
    what the unconstrained plan needs beside them),
    gradient check."""
    params, x = init(**sizes)
    inv = tierax.inventory(loss_fn(None), params, x)
    if squeeze:
        free = tierax.plan(inv, target=target).predicted
        fixed = free.breakdown.fixed_device_bytes  # XLA:GPU's own buffers: no plan moves them
        budget = fixed + squeeze * (free.peak_device_bytes - fixed)
    planned = tierax.plan(inv, target=target, budget=budget)
    no_remat = jax.grad(
        lambda p, x: jnp.mean(jax.lax.scan(lambda h, q: (layer(h, q), None), x, p)[0] ** 2)
    )
    reference = no_remat(params, x)
    grads = jax.grad(loss_fn(planned.policy("mlp")))(params, x)
    worst = max(
        float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-30))
        for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(grads), strict=False)
    )
    return {"inventory": inv, "planned": planned, "budget": budget, "max_rel_grad_error": worst}


def compile_for_gpu(policy, target: str, **sizes) -> dict:
    """XLA's memory figures of the planned gradient step compiled for ``target`` here (no GPU).

    Call ``tierax.launch.start(deviceless_gpu=True)`` before JAX starts (``main`` does).
    """
    from jax.sharding import SingleDeviceSharding

    from tierax import hardware
    from tierax.hardware.target_config import render_target_config
    from tierax.xla import compile as tc

    tc.check_gpu_aot()
    topo = tc.gpu_topology(render_target_config(hardware.get_target(target)), 1, target)
    on_gpu = SingleDeviceSharding(topo.devices[0])
    args = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=on_gpu),
        jax.eval_shape(lambda: init(**sizes)),
    )
    memory = jax.jit(jax.grad(loss_fn(policy))).lower(*args).compile().memory_analysis()
    return {
        "temp_bytes": memory.temp_size_in_bytes,
        "host_temp_bytes": memory.host_temp_size_in_bytes,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-mib", type=float, help="device budget per device, MiB")
    p.add_argument(
        "--squeeze",
        type=float,
        default=0.9,
        help="budget: XLA:GPU's fixed buffers plus this fraction of what the unconstrained plan "
        "needs beside them (default %(default)s; ignored "
        "with --budget-mib)",
    )
    p.add_argument("--target", default="h200")
    p.add_argument(
        "--compile-for",
        metavar="GPU",
        help="also compile the planned step for this GPU, deviceless",
    )
    a = p.parse_args()
    if a.compile_for:
        from tierax import launch

        launch.start(
            deviceless_gpu=True
        )  # before JAX starts: host platform only, GPU compiles deviceless
    out = run(
        a.budget_mib and a.budget_mib * 2**20, a.target, squeeze=None if a.budget_mib else a.squeeze
    )
    print("plan:", out["planned"].placements())
    pred = out["planned"].predicted
    print(
        f"predicted step {pred.step_time_s * 1e6:.1f} µs, peak "
        f"{pred.peak_device_bytes / 2**20:.2f} MiB, host {pred.host_bytes / 2**20:.2f} MiB"
    )
    print(f"gradients vs no remat: max relative error {out['max_rel_grad_error']:.2e}")
    if a.compile_for:
        mem = compile_for_gpu(out["planned"].policy("mlp"), a.compile_for)
        print(
            f"compiled for {a.compile_for} (deviceless): temp {mem['temp_bytes'] / 2**20:.2f} MiB, "
            f"host {mem['host_temp_bytes'] / 2**20:.2f} MiB (predicted host "
            f"{pred.host_bytes / 2**20:.2f} MiB)"
        )


if __name__ == "__main__":
    import sys

    from tierax.errors import TieraxError

    try:
        main()
    except TieraxError as e:  # bad input (e.g. a budget no plan fits): one line, exit 2
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr)
        sys.exit(2)
