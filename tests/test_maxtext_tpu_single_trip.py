"""MaxText's dense decoder whose one scanned stack makes a single trip on a TPU
(:mod:`tierax.interop.maxtext_program.tpu_single_trip`): the loss holds the trip's residuals (less
the plan's kept names read in place) and the last layer's gathered dense weights — read by hand from
synthetic groups and stacks, and counted by hand from a tiny OLMo 3 config's shapes on 4 chips: one
trip of its four-layer block (the Program's loss bytes grow by the rule's bytes) against two trips
(nothing added).
"""

from __future__ import annotations

from dataclasses import dataclass

import maxtext_cli as M
from test_maxtext_tpu_blocks import BF16, BLOCK, FSDP, LAYER, OLMO3, _stack
from test_maxtext_tpu_blocks import _kernel as _block_kernel

from tierax.interop.maxtext_program import tpu_single_trip
from tierax.interop.maxtext_program.weight_stacks import Stack

pytestmark = [M.requires_maxtext, M.programs_once]


@dataclass(frozen=True)
class _Act:
    name: str
    read_in_place: bool
    logical_held_bytes_per_layer: int


@dataclass(frozen=True)
class _Group:
    name: str
    num_layers: int
    written_residual_bytes_per_layer: int = 1000
    activations: tuple = ()


@dataclass(frozen=True)
class _Inv:
    groups: tuple
    mesh: dict


def test_the_family_one_dense_stack_of_one_trip():
    """Only a decoder that is one dense stack scanned once, under scan_layers."""
    one = _Group("layers", 1)
    assert tpu_single_trip.single_trip_group(_Inv((one,), {}), True) is one
    assert tpu_single_trip.single_trip_group(_Inv((one,), {}), False) is None
    assert tpu_single_trip.single_trip_group(_Inv((_Group("layers", 2),), {}), True) is None
    assert tpu_single_trip.single_trip_group(_Inv((one,), {}), True, ["layers"]) is None
    two = (_Group("dense_layers", 1), _Group("moe_layers", 1))
    assert tpu_single_trip.single_trip_group(_Inv(two, {}), True) is None


def test_residuals_less_the_kept_names_read_in_place():
    """The written residuals less the names kept on device that are read in place; the carry, an
    offloaded or recomputed name and a kept name not read in place stay in."""
    acts = (
        _Act("decoder_layer_input", True, 10),
        _Act("query_proj", True, 20),  # kept, read in place: out
        _Act("key_proj", False, 40),  # kept, not read in place: in
        _Act("value_proj", True, 80),  # offloaded: in
        _Act("mlpwo", True, 160),  # recomputed: in
    )
    g = _Group("layers", 1, 1000, acts)
    where = {
        "decoder_layer_input": "device",
        "query_proj": "device",
        "key_proj": "device",
        "value_proj": "offload",
        "mlpwo": "remat",
    }
    assert tpu_single_trip.residual_bytes(g, where) == 1000 - 20
    assert tpu_single_trip.residual_bytes(g, {}) == 1000


def _kernel(path: str, d: int, f: int) -> Stack:
    """A [d, 1, f] kernel sharded over fsdp on d (as MaxText's ``embed`` is), one trip."""
    return _block_kernel(path, d, f, layers=1)


def test_the_last_layer_of_the_block():
    """The highest-numbered block layer's gathered kernels (layers_10 after layers_9), its norm
    scale and a routed expert's stack left out; a stack of single layers: the layer's own."""
    stacks = [
        _kernel("decoder/layers/layers_9/mlp/wi_0/kernel", 256, 512),
        _kernel("decoder/layers/layers_10/mlp/wi_0/kernel", 256, 1024),
        _kernel("decoder/layers/layers_10/mlp/wo/kernel", 256, 512),
        _stack(
            "decoder/layers/layers_10/post_mlp_layer_norm/scale",
            ("norm", "layers"),
            (256, 1),
            ((), ()),
        ),  # fmt: skip
        _stack(
            "decoder/layers/layers_10/moe/wi_0",
            ("exp", "layers", "embed", "mlp"),
            (8, 1, 256 // FSDP, 512),
            ((), (), ("fsdp",), ()),
        ),
        _kernel("decoder/dense/mlp/wi_0/kernel", 256, 384),
    ]
    assert tpu_single_trip.last_layer_elements(stacks, "layers") == 256 * 1024 + 256 * 512
    assert tpu_single_trip.last_layer_elements(stacks, "dense") == 256 * 384
    assert tpu_single_trip.last_layer_elements(stacks, "none") == 0


# OLMo 3's block (four layers) at d 256, 4 heads of 64, gated MLP 512: the config of
# tests/test_maxtext_tpu_blocks.py, cut to one trip and to two.
TINY = OLMO3


def _program(trips: int):
    from tierax.interop.maxtext_program import program

    keys = [*TINY, f"base_num_decoder_layers={trips * BLOCK}"]
    return program(M.base_yml(), keys, target="v6e", devices=FSDP, microbatch=1, seq=256)


def _looped_loss(mp) -> int:
    """The loss bytes the looped reading gives (tpu_terms), from the same config."""
    from tierax.interop.maxtext_program import tpu_terms
    from tierax.interop.maxtext_program.config import load

    p = mp.program
    keys = [*TINY, f"base_num_decoder_layers={p.inventory.groups[0].num_layers * BLOCK}"]
    mesh = dict(mp.mesh)
    with load(M.base_yml(), keys, mesh=mesh, microbatch=1, seq=256) as loaded:
        return tpu_terms.tpu_terms(loaded.config, p.inventory, "v6e").loss_bytes


def test_one_trip_holds_the_residuals_and_the_last_layer_at_the_loss():
    """One trip of the block under ``full`` (nothing kept but the carry): the loss bytes are the
    looped reading's plus the block's written residuals and one layer's kernels in bf16."""
    mp = _program(1)
    (g,) = mp.program.inventory.groups
    assert g.num_layers == 1
    added = g.written_residual_bytes_per_layer + BF16 * LAYER
    assert mp.program.loss_bytes == _looped_loss(mp) + added


def test_two_trips_add_nothing():
    """Two trips: a loop; the loss bytes are the looped reading's."""
    mp = _program(2)
    assert mp.program.inventory.groups[0].num_layers == 2
    assert mp.program.loss_bytes == _looped_loss(mp)
