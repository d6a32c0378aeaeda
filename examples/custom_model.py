#!/usr/bin/env python3
"""The tierax inventory on a model written outside tierax.models (plain JAX, no Flax).

A residual MLP stack scanned over layers; each layer tags its activations with
``checkpoint_name``.  ``trace_inventory`` reads them from the whole loss function;
``layer_inventory`` measures, from the layer function alone, what each one costs to
rematerialise.  Run: ``.venv/bin/python examples/custom_model.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from tierax.tracing.inventory import layer_inventory, trace_inventory

B, S, D, F, LAYERS = 4, 128, 256, 1024, 6


def layer(x_BSD, p):
    h_BSF = checkpoint_name(x_BSD @ p["w_in"], "mlpwi_0")
    g_BSF = checkpoint_name(jax.nn.gelu(h_BSF), "mlpwi_1")
    return x_BSD + checkpoint_name(g_BSF @ p["w_out"], "mlpwo")


def loss(params, x_BSD):
    def body(x, p):
        return jax.checkpoint(
            layer, policy=jax.checkpoint_policies.save_only_these_names("mlpwi_0")
        )(x, p), None

    with jax.named_scope("tierax_group_mlp"):  # optional: names the layer group in the inventory
        y, _ = jax.lax.scan(body, x_BSD, params)
    return jnp.mean(y**2)


def main() -> None:
    f32 = jnp.float32
    stacked = {
        "w_in": jax.ShapeDtypeStruct((LAYERS, D, F), f32),
        "w_out": jax.ShapeDtypeStruct((LAYERS, F, D), f32),
    }
    one = {k: jax.ShapeDtypeStruct(v.shape[1:], f32) for k, v in stacked.items()}
    x = jax.ShapeDtypeStruct((B, S, D), f32)

    print("trace_inventory (whole loss function):")
    for a in trace_inventory(loss, stacked, x):
        print(f"  {a.group}/{a.name}: {a.bytes_per_layer:,} B per layer × {a.num_layers} layers")

    g = layer_inventory(layer, x, one, group="mlp", num_layers=LAYERS)
    print("layer_inventory (one layer, with recompute cost):")
    for a in g.activations:
        print(
            f"  {a.name}: {a.bytes_per_layer:,} B, remat costs "
            f"{a.recompute_flops_per_layer / 1e6:.1f} MFLOP per layer"
        )
    print(
        f"  everything a layer saves with no remat: {g.save_all_bytes_per_layer:,} B; "
        f"forward {g.forward_flops_per_layer / 1e6:.1f} MFLOP per layer"
    )


if __name__ == "__main__":
    import sys

    from tierax.errors import TieraxError

    try:
        main()
    except TieraxError as e:  # bad input (e.g. a budget no plan fits): one line, exit 2
        print(f"{sys.argv[0]}: error: {e}", file=sys.stderr)
        sys.exit(2)
