"""``--emit maxtext`` and MaxText override files for the training state: MaxText's
``optimizer_memory_host_offload`` / ``parameter_memory_host_offload``, what maps, what does not."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from tierax import plan as P
from tierax.errors import TieraxError
from tierax.interop import files, maxtext
from tierax.models import get_config

MESH = {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}


def emit(plan, cfg):
    return maxtext.overrides_yaml(plan, cfg, microbatch=2, seq=64, mesh=MESH)


def with_state(plan, state):
    return dataclasses.replace(plan, state=state)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-deepseek"])
def test_every_groups_moments_offloaded_writes_and_reads_back(tmp_path, model):
    cfg = get_config(model)
    plan = with_state(
        P.preset("minimal", cfg), {g.name: {"moments": "offload"} for g in cfg.layer_groups()}
    )
    text = emit(plan, cfg)
    data = yaml.safe_load(text)
    assert data["optimizer_memory_host_offload"] is True
    assert data["parameter_memory_host_offload"] is False
    assert "also offloads the embedding's and head's moments" in text
    f = tmp_path / "mt.yml"
    f.write_text(text)
    back = files.load_plan(str(f), cfg)  # with the mesh and microbatch the file was written for
    assert back == dataclasses.replace(plan, planned_for=back.planned_for)
    assert back.state == plan.state and back.mesh is not None


def test_what_does_not_map_is_written_false_and_said():
    cfg = get_config("tiny-deepseek")
    base = P.preset("minimal", cfg)
    text = emit(with_state(base, {"moe": {"moments": "offload", "master_weights": "offload"}}), cfg)
    data = yaml.safe_load(text)
    assert data["optimizer_memory_host_offload"] is False  # all or nothing in MaxText
    assert data["parameter_memory_host_offload"] is False
    assert "the moments of moe only" in text and "master weights of moe" in text
    # A plan without state writes both switches false and says nothing about them.
    plain = emit(base, cfg)
    assert yaml.safe_load(plain)["optimizer_memory_host_offload"] is False
    assert "master weights" not in plain


@pytest.mark.parametrize(
    "edit, fragment",
    [
        ({"parameter_memory_host_offload": True}, "no tierax counterpart"),
        ({"optimizer_memory_host_offload": "yes"}, "is not a boolean"),
    ],
)
def test_bad_state_keys_in_override_files_refused(tmp_path, edit, fragment):
    cfg = get_config("tiny-llama")
    data = yaml.safe_load(emit(P.preset("minimal", cfg), cfg)) | edit
    f = tmp_path / "mt.yml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(TieraxError, match=fragment):
        files.load_plan(str(f), cfg)
