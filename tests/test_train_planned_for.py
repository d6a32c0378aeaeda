"""``tierax train`` takes what its plan was planned for through the one merge every verb uses
(issue 60, leftovers of items 1–5): mesh, microbatch, accumulation and sequence length come from the
plan where the config leaves them out and are refused where they differ; a named model must be the
one the plan records."""

from __future__ import annotations

import pytest

from tierax.errors import TieraxError
from tierax.mesh import MeshShape
from tierax.train.config import config_from_mapping

PLAN = {
    "plan": "p",
    "planned_for": {"model": "tiny-llama", "mesh": {"fsdp": 2}, "microbatch": 2, "seq": 32,
                    "grad_accum": 3},
    "groups": {"decoder": {"decoder_layer_input": "device"}},
}  # fmt: skip


def test_a_config_without_them_takes_the_plans_seq_microbatch_accumulation_and_mesh():
    cfg = config_from_mapping({"model": "tiny-llama", "plan": PLAN}, source="c")
    assert (cfg.seq, cfg.microbatch, cfg.grad_accum) == (32, 2, 3)
    assert cfg.mesh == MeshShape(fsdp=2)


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"seq": 64}, "seq 64 differs from the seq plan 'p' was planned for (32)"),
        ({"grad_accum": 1}, "grad_accum 1 differs from the grad_accum plan 'p' was planned for"),
        ({"mesh": {"fsdp": 4}}, "differs from the mesh plan 'p' was planned for"),
    ],
)
def test_a_differing_value_is_refused_naming_both(extra, fragment):
    with pytest.raises(TieraxError) as e:
        config_from_mapping({"model": "tiny-llama", "plan": PLAN, **extra}, source="c")
    assert fragment in str(e.value)


def test_a_named_model_other_than_the_plans_is_refused():
    with pytest.raises(TieraxError, match=r"model 'tiny-mixtral' differs from the model plan 'p' "
                       r"was planned for \('tiny-llama'\)"):  # fmt: skip
        config_from_mapping({"model": "tiny-mixtral", "plan": PLAN}, source="c")
    # the same name agrees
    assert config_from_mapping({"model": "tiny-llama", "plan": PLAN}, source="c").seq == 32
