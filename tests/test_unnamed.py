"""A group's unnamed intermediates: recomputed unless the plan keeps them (``unnamed: device``).

MaxText's ``custom`` policy (``save_and_offload_only_these_names``) keeps the named tensors and
recomputes every untagged one, also when every name is on device; only ``save-all`` (``unnamed:
device``) runs the group without rematerialisation.  Checked in the traced gradient (the matmul
FLOPs the backward executes), in the cost model and in the plan's YAML form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tierax import costmodel as cm
from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import abstract_model, get_config
from tierax.tracing import inventory as inv_lib
from tierax.tracing import jaxpr_tools
from tierax.tracing.model_program import for_inventory
from tierax.train import step as S

TINY = ["tiny-llama", "tiny-deepseek"]


def _all_named_on_device(cfg) -> P.Plan:
    groups = {
        g.name: P.GroupPlan({n: P.Placement.DEVICE for n in g.activations})
        for g in cfg.layer_groups()
    }
    return P.Plan("named-on-device", groups)


def _gradient_flops(cfg, plan, tokens) -> int:
    graphdef, params = nnx.split(abstract_model(cfg))
    loss = S.make_loss_fn(graphdef, P.to_policies(plan, cfg))
    return jaxpr_tools.matmul_flops(jax.make_jaxpr(jax.value_and_grad(loss))(params, tokens))


@pytest.mark.parametrize("model", TINY)
def test_every_name_on_device_still_recomputes_the_unnamed_in_the_traced_gradient(model):
    cfg = get_config(model)
    tokens = jax.ShapeDtypeStruct((2, 33), jnp.int32)
    save_all = _gradient_flops(cfg, P.preset("save-all", cfg), tokens)
    named = _gradient_flops(cfg, _all_named_on_device(cfg), tokens)
    full = _gradient_flops(cfg, P.preset("remat-full", cfg), tokens)
    # the untagged matmuls (attention's scores and weighted sum, the router) run again in the
    # backward; remat-full recomputes the named projections as well
    assert save_all < named < full
    # the difference is what the cost model charges as the groups' unnamed recompute
    inv = inv_lib.model_inventory(cfg, 2, 32, {"fsdp": 1})
    unnamed = sum(g.base_recompute_flops_per_layer * g.num_layers for g in inv.groups)
    assert named - save_all == pytest.approx(unnamed, rel=1e-9)
    assert unnamed > 0


@pytest.mark.parametrize(
    "model", ["tiny-llama", pytest.param("tiny-deepseek", marks=pytest.mark.slow)]  # MoE: 13 s
)
def test_gradients_with_every_name_on_device_equal_save_all(model):
    cfg = get_config(model)
    graphdef, params = S.init_params(cfg, seed=1)
    tokens = S.synthetic_batch(cfg, 2, 32, seed=2)
    ref_loss, ref = S.loss_and_grads(graphdef, cfg, P.preset("save-all", cfg), params, tokens)
    loss, got = S.loss_and_grads(graphdef, cfg, _all_named_on_device(cfg), params, tokens)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    def rel(a, b):
        return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))

    err = max(jax.tree.leaves(jax.tree.map(rel, got, ref)))
    assert err <= 1e-5


def test_the_cost_model_charges_the_unnamed_recompute_and_saves_their_bytes():
    cfg = get_config("tiny-llama")
    inv = inv_lib.model_inventory(cfg, 4, 64, {"fsdp": 1})
    rates = cm.Rates("hand", 1e12, 1e12, 1e9, 1e9, 1e9, 10**12, 10**12, True)
    kept = cm.simulate(P.preset("save-all", cfg), for_inventory(cfg, inv), rates, "serial")
    named = cm.simulate(_all_named_on_device(cfg), for_inventory(cfg, inv), rates, "serial")
    (g,) = inv.groups
    assert named.breakdown.recompute_s == pytest.approx(
        g.base_recompute_flops_per_layer * g.num_layers / 1e12
        + g.base_recompute_hbm_bytes_per_layer * g.num_layers / 1e12,
        rel=1e-9,
    )
    assert kept.breakdown.recompute_s == 0
    # save-all keeps every residual; the named plan keeps what each name holds (a name the backward
    # never needs, Llama's mlpwo, holds nothing whichever placement it has)
    extra = (g.save_all_bytes_per_layer - sum(a.held_bytes_per_layer for a in g.activations)) * (
        g.num_layers
    )
    assert any(a.held_bytes_per_layer == 0 < a.bytes_per_layer for a in g.activations)
    assert kept.breakdown.activation_bytes - named.breakdown.activation_bytes == extra
    assert extra > 0


def test_unnamed_round_trips_through_yaml_and_is_refused_where_it_cannot_hold():
    cfg = get_config("tiny-llama")
    plan = P.preset("save-all", cfg)
    text = plan.to_yaml()
    assert "unnamed: device" in text
    back = P.Plan.from_yaml(text)
    assert P.unnamed_placements(back, cfg) == {"decoder": P.Placement.DEVICE}
    assert P.unnamed_placements(P.preset("minimal", cfg), cfg) == {"decoder": P.Placement.REMAT}
    # keeping every intermediate while recomputing a name is contradictory: refused, named
    bad = text.replace("query_proj: device", "query_proj: remat")
    with pytest.raises(TieraxError, match="unnamed: device keeps every intermediate.*query_proj"):
        P.resolve(P.Plan.from_yaml(bad), cfg)
    with pytest.raises(TieraxError, match="unnamed: offload"):
        P.Plan.from_yaml(text.replace("unnamed: device", "unnamed: offload"))
    with pytest.raises(TieraxError, match="placement 'sometimes'"):
        P.Plan.from_yaml(text.replace("unnamed: device", "unnamed: sometimes"))
