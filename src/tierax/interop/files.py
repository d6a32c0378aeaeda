"""Input files that may be another tool's: told apart by their keys and read as tierax's own.

The command line and the training config read model configs and plans through here, so a MaxText
override file works as a plan and a MaxText model YAML or a Hugging Face ``config.json`` as a model
config; the core loaders (:func:`tierax.models.load_model_config`,
:func:`tierax.plan.load_plan`) read only tierax's formats.
"""

from __future__ import annotations

import pathlib

import yaml

from tierax import plan as plan_lib
from tierax import schema
from tierax.interop import maxtext_keys, model_files
from tierax.models import config_files


def load_model_config(path: str | pathlib.Path):
    """A model config file: tierax's YAML (``family`` plus fields), a MaxText model YAML or a
    Hugging Face ``config.json`` (:mod:`tierax.interop.model_files` tells them apart).

    Raises:
      TieraxError: the file is missing or unreadable, not YAML, not a mapping, or not a valid
        config of its kind.
    """
    data = schema.read_yaml(path, "model config file", config_files.FILE_HINT)
    foreign = model_files.load_foreign(data, path)
    return foreign if foreign is not None else config_files.config_from_dict(data, source=str(path))


def load_plan(spec: str | plan_lib.Plan, cfg) -> plan_lib.Plan:
    """A preset, a tierax plan file or MaxText overrides (``remat_policy: custom``, as ``--emit
    maxtext`` writes, refused when its model keys describe another model), validated against
    ``cfg``.

    Raises:
      TieraxError: as :func:`tierax.plan.load_plan`, or an override file for another model.
    """
    if isinstance(spec, str) and spec not in plan_lib.PRESETS and pathlib.Path(spec).is_file():
        try:
            text = pathlib.Path(spec).read_text(encoding="utf-8")
            data = yaml.safe_load(text)
        except (UnicodeDecodeError, yaml.YAMLError):
            data = None  # not another tool's file either: tierax's loader says what is wrong
        if maxtext_keys.is_override_file(data):
            maxtext_keys.check_model(data, cfg, spec)
            groups = {g.name: g.activations for g in cfg.layer_groups()}
            spec = plan_lib.Plan.from_dict(
                maxtext_keys.plan_dict(data, groups, source=spec, text=text), source=spec
            )
    return plan_lib.load_plan(spec, cfg)


def read_planned_for(spec: str | None) -> plan_lib.PlannedFor | None:
    """What a plan file records it was planned for (a tierax plan's ``planned_for``; MaxText
    overrides' ``ici_*``/``dcn_*``, ``per_device_batch_size``, ``gradient_accumulation_steps`` and
    ``max_target_length``), read before the model is known; None for a preset or what is no plan
    file (its verb's loader says why later).

    Raises:
      TieraxError: the file's record is malformed.
    """
    if not spec or spec in plan_lib.PRESETS or not pathlib.Path(spec).is_file():
        return None
    try:
        data = yaml.safe_load(pathlib.Path(spec).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return None
    if maxtext_keys.is_override_file(data):
        source = f"MaxText overrides {spec!r}"
        return plan_lib.PlannedFor.from_dict(maxtext_keys.planned_for(data, source), source)
    if isinstance(data, dict) and "groups" in data:
        return plan_lib.Plan.from_dict(data, source=f"plan file {spec!r}").planned_for
    return None
