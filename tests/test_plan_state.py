"""A plan's ``state:`` (training state per layer group): the typed value, its YAML round trip, what
it refuses, and the one function that turns it into shardings with memory kinds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tierax import plan as P
from tierax.errors import TieraxError
from tierax.models import abstract_model, get_config

YAML = """
plan: moments-host
groups:
  dense: {default: remat}
  moe: {default: remat}
state:
  moe: {moments: offload, master_weights: device}
  dense: {master_weights: offload, grad_accum: offload}
"""


def test_state_yaml_round_trip_and_defaults():
    cfg = get_config("tiny-deepseek")
    plan = P.load_plan(P.Plan.from_yaml(YAML), cfg)
    assert plan.state_of("moe").moments is P.Placement.OFFLOAD
    assert plan.state_of("moe").grad_accum is P.Placement.DEVICE  # not listed: device
    assert plan.state_of("dense").offloaded == ("master_weights", "grad_accum")
    back = P.Plan.from_yaml(plan.to_yaml())
    assert back == plan and back.state_of("dense") == plan.state_of("dense")
    assert "state" in plan.to_dict() and plan.offloads_state
    # A plan without state writes no state key and offloads none.
    plain = P.preset("minimal", cfg)
    assert "state" not in plain.to_dict() and not plain.offloads_state
    assert plain.state_of("moe") == P.StatePlacement()


@pytest.mark.parametrize(
    "state, words",
    [
        ("{moe: {moments: remat}}", ["'remat'", "device, offload"]),
        ("{moe: {moments: hbm}}", ["'hbm'", "use one of: device, offload"]),
        ("{moe: {adam: offload}}", ["adam", "moments", "master_weights", "grad_accum"]),
        ("{moe: offload}", ["moments, master_weights, grad_accum"]),
        ("[moe]", ["'state' must map layer group names"]),
    ],
)
def test_bad_state_refused_with_valid_values(state, words):
    text = YAML.split("state:")[0] + f"state: {state}\n"
    with pytest.raises(TieraxError) as e:
        P.Plan.from_yaml(text)
    for w in words:
        assert w in str(e.value)


def test_state_group_checked_against_model():
    plan = P.Plan.from_yaml(YAML.replace("  moe: {moments", "  decoder: {moments"))
    with pytest.raises(TieraxError, match="'decoder'.*its groups: dense, moe"):
        P.load_plan(plan, get_config("tiny-deepseek"))


def test_state_shardings_memory_kinds():
    """Every leaf of an offloaded group's part, and only those, gets pinned_host."""
    cfg = get_config("tiny-deepseek")
    plan = P.Plan.from_yaml(YAML)
    _, abstract = nnx.split(abstract_model(cfg))
    mesh = Mesh(jax.devices()[:1], ("fsdp",))
    rep = NamedSharding(mesh, PartitionSpec())
    params = jax.tree.map(lambda _: rep, abstract)
    opt = optax.adamw(1e-3)
    opt_state = jax.tree.map(lambda _: rep, jax.eval_shape(opt.init, abstract))

    def kinds(tree):
        out = {}
        for path, s in jax.tree_util.tree_leaves_with_path(tree):
            out.setdefault(P.layer_group_of(path), set()).add(s.memory_kind)
        return out

    assert kinds(P.state_shardings(plan, params, "master_weights")) == {
        "dense": {"pinned_host", "device"},
        "moe": {"device"},
        None: {"device"},  # embedding, final norm, head
    }
    # Of an offloaded group's parameters, the kernels go to the host (a compute-dtype copy stands
    # in for them); the norm scales, which the model uses in float32, stay.
    masters = P.state_shardings(plan, params, "master_weights")
    dense = {
        jax.tree_util.keystr(path[-2:-1]): s.memory_kind
        for path, s in jax.tree_util.tree_leaves_with_path(masters)
        if P.layer_group_of(path) == "dense"
    }
    assert dense == {"['kernel']": "pinned_host", "['scale']": "device"}
    got = kinds(P.state_shardings(plan, opt_state, "moments"))
    assert got == {"dense": {"device"}, "moe": {"pinned_host"}, None: {"device"}}
    # The moments are really found inside the optimizer state (mu and nu of every moe leaf).
    n_moe = sum(
        1 for p, _ in jax.tree_util.tree_leaves_with_path(abstract) if P.layer_group_of(p) == "moe"
    )
    placed = P.state_shardings(plan, opt_state, "moments")
    n_host = sum(1 for s in jax.tree.leaves(placed) if s.memory_kind == "pinned_host")
    assert n_host == 2 * n_moe
    with pytest.raises(TieraxError, match="moments, master_weights, grad_accum"):
        P.state_shardings(plan, params, "params")
    # The shardings place real arrays (CPU has pinned_host).
    x = jax.device_put(jnp.ones(3), rep.with_memory_kind("pinned_host"))
    assert x.sharding.memory_kind == "pinned_host"


def test_host_memory_required_where_devices_list_their_memories():
    plan = P.Plan.from_yaml(YAML)

    class Memory:
        def __init__(self, kind):
            self.kind = kind

    class Device:  # a backend whose devices have device memory only
        platform = "fakeaccel"

        def __init__(self, kinds):
            self.kinds = kinds

        def addressable_memories(self):
            return [Memory(k) for k in self.kinds]

    with pytest.raises(TieraxError, match="fakeaccel devices here have memory kinds device"):
        P.require_host_memory(plan, [Device(["device"])], "train")
    P.require_host_memory(plan, jax.devices()[:1], "train")  # CPU lists pinned_host
    P.require_host_memory(plan, [Device([])], "compile")  # compile-only: none listed
    P.require_host_memory(P.Plan.from_yaml(YAML.split("state:")[0]), [Device(["device"])], "t")
