"""MaxText's scanned blocks of several layers on a TPU
(:mod:`tierax.interop.maxtext_program.tpu_blocks`): the backward gathers one of the block's layers'
weights at a time on v6e, so the layer workspace holds the largest layer's gathered weights, not
the block's — read by hand from synthetic stacks (the block's layers named ``layers_<i>``, kernels
gathered over FSDP, norm scales and routed experts left out), the generations it applies to, and
counted by hand from a tiny OLMo 3 config's shapes (one scanned block of four layers, two trips) on
4 chips: the Program's figure and the cost model's workspace on v6e, the whole block's on v5p.
"""

from __future__ import annotations

import maxtext_cli as M
import pytest

from tierax.interop.maxtext_program import tpu_blocks
from tierax.interop.maxtext_program.weight_stacks import Stack

pytestmark = [M.requires_maxtext, M.programs_once]

FSDP = 4
BF16 = 2
MESH = (("data", 1), ("fsdp", FSDP), ("tensor", 1), ("expert", 1))


def _stack(path: str, names: tuple, shape: tuple, axes: tuple) -> Stack:
    return Stack(
        path=path,
        group=path.split("/")[1],
        names=names,
        axes=axes,
        local_shape=shape,
        dtype="float32",
        mesh=MESH,
    )


def _kernel(path: str, d: int, f: int, layers: int = 2) -> Stack:
    """A [d, layers, f] kernel sharded over fsdp on d (as MaxText's ``embed`` is)."""
    return _stack(path, ("embed", "layers", "mlp"), (d // FSDP, layers, f), (("fsdp",), (), ()))


def test_block_layers_read_from_the_stacks():
    """Each block layer's gathered kernels (the shard × fsdp along the gathered dimension, the
    layer axis sliced off); a norm scale (not gathered) and a routed expert's stack left out; a
    stack of single layers (no ``layers_<i>``) not listed."""
    stacks = [
        _kernel("decoder/layers/layers_0/mlp/wi_0/kernel", 256, 512),
        _kernel("decoder/layers/layers_0/mlp/wo/kernel", 256, 512),
        _kernel("decoder/layers/layers_1/mlp/wi_0/kernel", 256, 1024),
        _stack(
            "decoder/layers/layers_1/post_mlp_layer_norm/scale",
            ("norm", "layers"),
            (256, 2),
            ((), ()),
        ),
        _stack(
            "decoder/layers/layers_1/moe/wi_0",
            ("exp", "layers", "embed", "mlp"),
            (8, 2, 256 // FSDP, 512),
            ((), (), ("fsdp",), ()),
        ),
        _kernel("decoder/dense/mlp/wi_0/kernel", 256, 512),
    ]
    layers = tpu_blocks.block_layer_elements(stacks)
    assert layers == {"layers": {"layers_0": 2 * 256 * 512, "layers_1": 256 * 1024}}
    assert tpu_blocks.one_layer_bytes(layers, BF16) == (("layers", BF16 * 2 * 256 * 512),)


def test_a_block_of_one_layer_is_no_block():
    """A stack whose tree names a single ``layers_0`` (a block cut to one layer) is left out: its
    layer is the scanned layer."""
    stacks = [_kernel("decoder/layers_remainder/layers_0/mlp/wi_0/kernel", 256, 512)]
    assert tpu_blocks.block_layer_elements(stacks) == {}


@pytest.mark.parametrize(
    ("target", "applies"), [("v6e", True), ("v5p", False), ("v5e", False), ("v7x", False)]
)
def test_the_generations_read(target, applies):
    """One layer at a time where every compile read did (v6e); the whole block elsewhere (v5p's
    schedule varies with the program, v5e's and TPU7x's not read); never on a GPU."""
    assert tpu_blocks.applies(target) is applies
    assert tpu_blocks.applies("h200") is False
    assert tpu_blocks.applies(None) is False


# OLMo 3's block (decoder_block olmo3: four layers, sliding-window and global attention, QK norms
# over all heads, post-norms) at d 256, 4 heads of 64 (query and key/value), gated MLP 512.
D, HEADS, HD, F, VOCAB = 256, 4, 64, 512, 1024
BLOCK = 4  # layers per scanned block (inhomogeneous_layer_cycle_interval)
OLMO3 = [  # the block's shapes, at any depth
    "model_name=olmo3-7b",
    "override_model_config=true",
    f"base_emb_dim={D}",
    f"base_num_query_heads={HEADS}",
    f"base_num_kv_heads={HEADS}",
    f"head_dim={HD}",
    f"base_mlp_dim={F}",
    f"vocab_size={VOCAB}",
    "remat_policy=full",
]
TINY = [*OLMO3, f"base_num_decoder_layers={2 * BLOCK}"]  # two trips of the block: a loop
LAYER = 4 * D * HEADS * HD + 3 * D * F  # one layer's q, k, v, out and the MLP's three kernels
NORMS = 4 * D  # its four norm scales (pre-attention and pre-MLP post-norms, the q and k norms)


def _program(target: str):
    from tierax.interop.maxtext_program import program

    return program(M.base_yml(), TINY, target=target, devices=FSDP, microbatch=1, seq=256).program


@pytest.fixture(scope="module")
def v6e():
    return _program("v6e")


@pytest.fixture(scope="module")
def v5p():
    return _program("v5p")


def test_the_block_is_one_scanned_layer(v6e):
    """The trace's group is the block: two trips, every layer's parameters in its scanned layer."""
    (g,) = v6e.inventory.groups
    assert (g.name, g.num_layers) == ("layers", 2)
    assert g.layer_param_count == BLOCK * (LAYER + NORMS)


def test_v6e_workspace_gathers_one_layer(v6e):
    """On v6e the Program gives the block's one layer gathered in bf16 and the cost model's
    workspace is the block's written residuals and that layer's weights, not the block's four."""
    from tierax.costmodel import rates as rates_lib
    from tierax.costmodel.fixed import fixed_terms

    assert v6e.gathered_weight_bytes == (("layers", BF16 * LAYER),)
    (g,) = v6e.inventory.groups
    fx = fixed_terms(v6e, rates_lib.target_rates("v6e", "bfloat16"), "lhs")
    assert fx.workspace_bytes == g.written_residual_bytes_per_layer + BF16 * LAYER


def test_v5p_workspace_gathers_the_block(v5p):
    """On v5p no figure is given: the workspace gathers the whole block's weights (norms
    included), as before."""
    from tierax.costmodel import rates as rates_lib
    from tierax.costmodel.fixed import fixed_terms

    assert v5p.gathered_weight_bytes == ()
    (g,) = v5p.inventory.groups
    fx = fixed_terms(v5p, rates_lib.target_rates("v5p", "bfloat16"), "lhs")
    assert fx.workspace_bytes == g.written_residual_bytes_per_layer + BF16 * BLOCK * (LAYER + NORMS)
