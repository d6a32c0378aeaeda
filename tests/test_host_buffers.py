"""Host buffers found by name: ``compile`` attributes each offloaded name's host buffer by XLA's
metadata.

The prefetching scan (``mechanism: prefetch``, the default) writes each offloaded name's host stack
under a ``tierax_offload_<name>`` scope, and XLA:GPU keeps that scope in the op_name of the
dynamic-update-slice that stores to host.  Equal-size names (q/k projections of tiny-deepseek, k/v
of tiny-llama, ``moe_mlpwi_0/1``) are then told apart by name, not size; a name the program does not
store is not found (at another name's buffer); per-name host bytes sum to XLA's ``host_temp``.
Under ``mechanism: policy`` (JAX's offload policy) XLA's program keeps no name: buffers are matched
by size and the result says so.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from tierax import names as N
from tierax import plan as plan_lib
from tierax.models import get_config
from tierax.models.prefetch import OFFLOAD_SCOPE_PREFIX, prefetch_scan
from tierax.models.tags import tag
from tierax.xla import compile as C
from tierax.xla import hlo

SHAPE = {"microbatch": 2, "seq": 64}


def _plan(
    cfg, per_group: dict[str, dict[str, str]], mechanism: str = "prefetch", segments=None
) -> plan_lib.Plan:
    groups = {}
    for g in cfg.layer_groups():
        segs = tuple(plan_lib.Segment(a, b, pl) for a, b, pl in (segments or {}).get(g.name, []))
        groups[g.name] = plan_lib.GroupPlan(
            {N.DECODER_LAYER_INPUT: "device", **per_group.get(g.name, {})},
            plan_lib.Placement.REMAT,
            segs,
        )
    return plan_lib.Plan("host-buffers", groups, mechanism=mechanism)


def _compile(model: str, plan_for):
    cfg = get_config(model)
    result, text = C.compile_for_target(cfg, plan_for(cfg), "h200", **SHAPE)
    return result, C._forward_host_buffers(hlo.parse_module(text))


def _sums_to_host_temp(r):
    assert sum(r.offloaded_bytes_by_name.values()) == r.host_temp_bytes > 0
    assert not [n for n in r.notes if "unattributed" in n or "mismatch" in n]


# --- the store's scope names the value it stores (jaxpr, no compile) ------------------------------


def _jaxprs(j):
    yield j
    for e in j.eqns:
        for v in e.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    yield from _jaxprs(getattr(sub, "jaxpr", sub))


def test_each_host_store_is_scoped_by_the_name_of_the_value_it_stores():
    """Two equal-size tagged values: the put to host under ``tierax_offload_<n>`` takes the value
    tagged ``n``
    (checkpoint_name), and the store that writes it into the host stack runs under the same
    scope."""

    def body(x, p):
        return tag(x * p, N.KEY_PROJ) + tag(jnp.sin(x) * p, N.VALUE_PROJ)

    run = prefetch_scan(body, keep=(), offload=(N.KEY_PROJ, N.VALUE_PROJ))
    jaxpr = jax.make_jaxpr(jax.grad(lambda x, s: run(x, s).sum()))(jnp.ones(3), jnp.ones((4, 3)))
    stored = []
    for j in _jaxprs(jaxpr.jaxpr):
        made = {o: e for e in j.eqns for o in e.outvars}
        for e in j.eqns:
            scope = re.search(OFFLOAD_SCOPE_PREFIX + r"(\w+)", str(e.source_info.name_stack))
            if (
                e.primitive.name != "device_put"
                or e.params["devices"] != (jax.memory.Space.Host,)
                or not scope
            ):
                continue
            src = made[e.invars[0]]
            users = [u for u in j.eqns if e.outvars[0] in u.invars]
            assert src.primitive.name == "name" and src.params["name"] == scope.group(1)
            assert users and all(scope.group(0) in str(u.source_info.name_stack) for u in users)
            stored.append(scope.group(1))
    assert sorted(stored) == [N.KEY_PROJ, N.VALUE_PROJ]


# --- attribution, on synthetic buffers (no compile) -----------------------------------------------


def test_equal_size_buffers_are_attributed_by_name_whatever_their_order():
    bufs = [C.HostBuffer("d", "value_proj", 64), C.HostBuffer("d", "key_proj", 64)]
    found, notes = C._attribute([("d", "key_proj", 64), ("d", "value_proj", 64)], bufs, 128)
    assert [(o.name, o.host_bytes, o.matched_by) for o in found] == [
        ("key_proj", 64, "op_name"),
        ("value_proj", 64, "op_name"),
    ]
    assert notes == []


def test_a_name_xla_does_not_store_is_not_found_at_another_names_buffer():
    wanted = [("d", "key_proj", 64), ("d", "value_proj", 64)]
    found, notes = C._attribute(wanted, [C.HostBuffer("d", "value_proj", 64)], 64)
    assert {o.name: (o.on_host, o.matched_by) for o in found} == {
        "key_proj": (False, ""),
        "value_proj": (True, "op_name"),
    }


def test_size_mismatch_unnamed_buffers_and_unattributed_bytes_are_reported():
    found, notes = C._attribute([("d", "key_proj", 64)], [C.HostBuffer("d", "key_proj", 48)], 48)
    assert found[0].host_bytes == 48 and any(
        "48 bytes" in n and "expects 64" in n and "mismatch" in n for n in notes
    )
    # No names kept (XLA's offload policy): matched by size, the ambiguity said; host bytes outside
    # any buffer said.
    bufs = [C.HostBuffer("d", None, 64), C.HostBuffer("d", None, 64), C.HostBuffer("d", None, 32)]
    found, notes = C._attribute([("d", "key_proj", 64), ("d", "value_proj", 64)], bufs, 200)
    assert [o.matched_by for o in found] == ["size", "size"]
    assert any("matched by size" in n and "which buffer is which is unknown" in n for n in notes)
    assert any(
        n.startswith("72 bytes of XLA's host temp (200)") and "unattributed" in n and "d/? 32" in n
        for n in notes
    )


# --- deviceless H200 compiles ---------------------------------------------------------------------


def test_equal_size_key_and_value_projections_are_found_by_name():
    """tiny-llama: k and v projections are both 4 layers × 2 × 64 × 2 heads × 16 × 4 B = 64 KiB per
    device."""
    r, bufs = _compile(
        "tiny-llama",
        lambda cfg: _plan(cfg, {"decoder": {N.KEY_PROJ: "offload", N.VALUE_PROJ: "offload"}}),
    )
    assert sorted((b.group, b.name, b.nbytes) for b in bufs) == [
        ("decoder", N.KEY_PROJ, 65536),
        ("decoder", N.VALUE_PROJ, 65536),
    ]
    assert {(o.name, o.expected_bytes, o.host_bytes, o.matched_by) for o in r.offloaded} == {
        (N.KEY_PROJ, 65536, 65536, "op_name"),
        (N.VALUE_PROJ, 65536, 65536, "op_name"),
    }
    _sums_to_host_temp(r)


@pytest.mark.slow  # a deviceless GPU compile of the MoE step
def test_deepseek_names_found_by_name_and_no_swap():
    """tiny-deepseek: query_proj and key_proj are equal in size (96 KiB), value_proj is not (64
    KiB);
    ``moe_mlpwi_0`` is offloaded without its equal-size twin ``moe_mlpwi_1``.  A store labelled with
    the wrong name shows as a size mismatch (k ↔ v) or a name not on host (mlpwi_0 → mlpwi_1)."""
    attn = {N.QUERY_PROJ: "offload", N.KEY_PROJ: "offload", N.VALUE_PROJ: "offload"}
    moe = {**attn, "moe_mlpwi_0": "offload"}
    r, bufs = _compile("tiny-deepseek", lambda cfg: _plan(cfg, {"dense": attn, "moe": moe}))
    assert all(b.name is not None for b in bufs)
    got = {(o.group, o.name): (o.host_bytes, o.matched_by) for o in r.offloaded}
    assert got == {
        (g, n): (b, "op_name")
        for g in ("dense", "moe")
        for n, b in ((N.QUERY_PROJ, 98304), (N.KEY_PROJ, 98304), (N.VALUE_PROJ, 65536))
    } | {("moe", "moe_mlpwi_0"): (81920, "op_name")}
    assert [o.expected_bytes for o in r.offloaded] == [o.host_bytes for o in r.offloaded]
    _sums_to_host_temp(r)


QKV = {N.QUERY_PROJ: "offload", N.KEY_PROJ: "offload", N.VALUE_PROJ: "offload"}
CASES = {
    "tiny-llama": {"decoder": QKV},
    "tiny-deepseek": {
        "dense": QKV,
        "moe": {**QKV, "moe_mlpwi_0": "offload", "moe_mlpwi_1": "offload"},
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["prefetch", "policy"])
@pytest.mark.parametrize("model", sorted(CASES))
def test_per_name_host_bytes_sum_to_host_temp(model, mechanism):
    r, bufs = _compile(model, lambda cfg: _plan(cfg, CASES[model], mechanism))
    assert all(o.on_host and o.host_bytes == o.expected_bytes for o in r.offloaded)
    _sums_to_host_temp(r)
    if mechanism == "prefetch":
        assert {o.matched_by for o in r.offloaded} == {"op_name"}
    else:  # XLA's offload policy: its program keeps no activation name, and the result says so
        assert all(b.name is None for b in bufs) and {o.matched_by for o in r.offloaded} == {"size"}
        assert any("matched by size" in n for n in r.notes)


@pytest.mark.slow
def test_segmented_plan_buffers_are_found_by_segment_and_name():
    """Layers 0–1 offload k and v (equal size), layers 2–3 offload v only: each segment's buffers by
    name."""
    kv = {N.KEY_PROJ: "offload", N.VALUE_PROJ: "offload"}
    r, bufs = _compile(
        "tiny-llama",
        lambda cfg: _plan(
            cfg, {}, segments={"decoder": [(0, 2, kv), (2, 4, {N.VALUE_PROJ: "offload"})]}
        ),
    )
    assert sorted((b.group, b.name, b.nbytes) for b in bufs) == [
        ("decoder@0-1", N.KEY_PROJ, 32768),
        ("decoder@0-1", N.VALUE_PROJ, 32768),
        ("decoder@2-3", N.VALUE_PROJ, 32768),
    ]
    assert {(o.group, o.name, o.matched_by) for o in r.offloaded} == {
        ("decoder@0-1", N.KEY_PROJ, "op_name"),
        ("decoder@0-1", N.VALUE_PROJ, "op_name"),
        ("decoder@2-3", N.VALUE_PROJ, "op_name"),
    }
    _sums_to_host_temp(r)
