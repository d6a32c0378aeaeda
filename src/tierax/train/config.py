"""The training run configuration: one YAML file, typed and validated on load.

A config file is a mapping of the top-level keys of :class:`TrainConfig`, with
nested sections (``mesh``, ``optimizer``, ``data``, ``checkpoint``, ``log``,
``runtime``, ``debug``)::

    model: tiny-deepseek          # a named config, or an inline model config mapping
    plan: minimal                 # a preset, a plan YAML file, or an inline plan mapping
    microbatch: 8                 # sequences per device (or global_batch: N)
    seq: 128
    steps: 60
    mesh: {data: 1, fsdp: 2}
    optimizer: {lr: 0.01, warmup_steps: 5}
    data: {source: tokens, path: runs/demo/data}
    checkpoint: {every: 20, keep: 2}
    log: {dir: runs/demo/train}

Command-line overrides are ``KEY=VALUE`` with dotted keys for sections
(``mesh.fsdp=4``, ``optimizer.lr=3e-4``) and for fields of the model
(``model.d_model=128``, applied to a named or inline model).  Values are read as
YAML scalars.  Every problem is a :class:`~tierax.errors.TieraxError` that names
the key and the valid choices.  Relative paths are relative to the working
directory.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.fileio import check_output_dir
from tierax.interop import files
from tierax.launch import flags as xla_flags
from tierax.mesh import BATCH_AXES, MeshShape
from tierax.models import ModelConfig, apply_overrides, config_from_dict, config_to_dict, get_config
from tierax.schema import field_types, read_yaml, scalar, unknown_keys
from tierax.train import accumulate
from tierax.train.sections import (
    COMPUTE_DTYPES,
    SECTIONS,
    CheckpointConfig,
    DataConfig,
    DebugConfig,
    LogConfig,
    OptimizerConfig,
    RuntimeConfig,
    _check,
)

# --- the run --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A resolved, validated training run.

    Attributes:
      model: the model (``compute_dtype`` already applied).
      plan: the activation plan, validated against ``model``.
      microbatch: sequences per device per microbatch (the project-wide meaning).
      seq: tokens per sequence.
      grad_accum: microbatches per optimizer step.
      steps: optimizer steps of the whole run (a resumed run continues to it).
      seed: parameter initialisation and data order.
      cpu_devices: host CPU devices per process (CPU backend; default: the mesh
        size over the process count).
      xla_preset: a key of :data:`tierax.launch.flags.PRESETS`.
      source: where the config came from (for messages).
    """

    model: ModelConfig
    plan: plan_lib.Plan
    microbatch: int = 8
    seq: int = 64
    grad_accum: int = 1
    steps: int = 100
    seed: int = 0
    cpu_devices: int | None = None
    xla_preset: str = "none"
    mesh: MeshShape = field(default_factory=MeshShape)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    source: str = "config"

    def __post_init__(self) -> None:
        for key in ("microbatch", "seq", "steps"):
            _check(
                getattr(self, key) >= 1,
                f"{self.source}: {key} must be ≥ 1, got {getattr(self, key)}",
            )
        _check(
            self.grad_accum >= 1,
            f"{self.source}: grad_accum must be ≥ 1 (1: no accumulation), got {self.grad_accum}",
        )
        _check(self.seed >= 0, f"{self.source}: seed must be ≥ 0, got {self.seed}")
        _check(
            self.xla_preset in xla_flags.PRESETS,
            f"{self.source}: xla_preset={self.xla_preset!r} is unknown; choose one of: "
            f"{', '.join(xla_flags.PRESETS)}",
        )
        self.mesh.check_model(self.model, where=f"{self.source}: mesh", config_keys=True)
        plan_lib.check_mechanism_preset(self.plan, self.xla_preset, f"{self.source}: plan")
        # Training state the step cannot run: refused
        # here, before the run directory or any state exists.
        accumulate.check_runs(self.plan, self.grad_accum, f"{self.source}: plan")
        if self.cpu_devices is not None:
            _check(
                self.cpu_devices >= 1,
                f"{self.source}: cpu_devices must be ≥ 1, got {self.cpu_devices}",
            )
        decay = self.decay_steps
        _check(
            self.optimizer.warmup_steps < decay,
            f"{self.source}: optimizer.warmup_steps={self.optimizer.warmup_steps} must be below "
            f"the decay horizon ({decay} = optimizer.decay_steps or steps)",
        )
        _check(
            self.debug.nan_at_step is None or self.debug.nan_at_step <= self.steps,
            f"{self.source}: debug.nan_at_step={self.debug.nan_at_step} is after the last step "
            f"{self.steps}",
        )
        plan_lib.resolve(self.plan, self.model)
        _check(
            not (self.data.document_mask and self.model.attention == "cudnn"),
            f"{self.source}: data.document_mask needs an attention that masks packed documents; "
            "attention=cudnn cannot (JAX's cuDNN entry takes no segment ids): use "
            "model.attention=blockwise",
        )

    @property
    def global_batch(self) -> int:
        """Sequences per microbatch over all devices: microbatch × the mesh's batch axes."""
        return self.microbatch * self.mesh.batch_ways

    @property
    def batch_per_step(self) -> int:
        """Sequences per optimizer step: global batch × grad_accum."""
        return self.global_batch * self.grad_accum

    @property
    def decay_steps(self) -> int:
        return self.optimizer.decay_steps if self.optimizer.decay_steps is not None else self.steps

    @property
    def checkpoint_dir(self) -> pathlib.Path | None:
        if self.checkpoint.every == 0:
            return None
        return pathlib.Path(self.checkpoint.dir or os.path.join(self.log.dir, "checkpoints"))

    def check_outputs(self) -> None:
        """Refuse, before any work, a log or checkpoint directory that cannot be written.

        Raises:
          TieraxError: ``log.dir`` or ``checkpoint.dir`` is a file, unwritable, or under one.
        """
        check_output_dir(self.log.dir, "log.dir")
        if self.checkpoint_dir is not None:
            check_output_dir(self.checkpoint_dir, "checkpoint.dir")

    def to_dict(self) -> dict[str, Any]:
        """The loadable form: model and plan inline, every section spelled out."""
        out: dict[str, Any] = {"model": config_to_dict(self.model), "plan": self.plan.to_dict()}
        for f in dataclasses.fields(self):
            if f.name in ("model", "plan", "source"):
                continue
            v = getattr(self, f.name)
            out[f.name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
        return out

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this run to be resumed by it: the model
        (not its name), the optimizer, the batch, the data and the seed.  The plan,
        mesh, step count, logging and debug knobs may change between runs."""
        model = config_to_dict(self.model)
        model.pop("name")
        opt = dataclasses.asdict(self.optimizer)
        opt["decay_steps"] = self.decay_steps
        return {
            "model": model,
            "optimizer": opt,
            "seq": self.seq,
            "batch_per_step": self.batch_per_step,
            "seed": self.seed,
            "data": {
                "source": self.data.source
            },  # the trainer adds the data's own identity (its hash)
        }


# --- loading --------------------------------------------------------------------

_TOP_KEYS = (
    "model",
    "plan",
    "microbatch",
    "global_batch",
    "seq",
    "grad_accum",
    "steps",
    "seed",
    "compute_dtype",
    "cpu_devices",
    "xla_preset",
    *SECTIONS,
)


def valid_keys() -> list[str]:
    """Every config key, sections dotted (``mesh.fsdp``)."""
    out = []
    for k in _TOP_KEYS:
        if k in SECTIONS:
            out += [f"{k}.{f.name}" for f in dataclasses.fields(SECTIONS[k])]
        else:
            out.append(k)
    return out


def _section(name: str, raw: Any, where: str):
    cls = SECTIONS[name]
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise TieraxError(
            f"{where}: {name} must be a mapping of "
            f"{', '.join(f.name for f in dataclasses.fields(cls))}"
        )
    fields = field_types(cls)
    unknown = [k for k in raw if k not in fields]
    if unknown:
        raise unknown_keys(unknown, list(fields), where, prefix=f"{name}.")
    values = {k: scalar(f"{name}.{k}", v, fields[k], where) for k, v in raw.items()}
    try:
        return cls(**values)
    except TieraxError as e:
        raise TieraxError(f"{where}: {e}") from None


def _model(raw: Any, model_overrides: Sequence[str], compute_dtype: str, where: str) -> ModelConfig:
    if isinstance(raw, str):
        cfg = get_config(raw)
    elif isinstance(raw, Mapping):
        cfg = config_from_dict(raw, source=f"{where}: model")
    else:
        raise TieraxError(
            f"{where}: model must be a named config (see `tierax models`) or a model config "
            "mapping (`tierax models show NAME` prints one)"
        )
    cfg = apply_overrides(cfg, model_overrides)
    if compute_dtype != "model":
        # Mixed precision: compute in compute_dtype, float32 master weights (and optimizer state).
        cfg = dataclasses.replace(cfg, dtype=compute_dtype, param_dtype="float32")
    return cfg


def _plan(raw: Any, cfg: ModelConfig, where: str) -> plan_lib.Plan:
    if isinstance(raw, Mapping):
        return plan_lib.load_plan(plan_lib.Plan.from_dict(raw, source=f"{where}: plan"), cfg)
    if not isinstance(raw, str):
        raise TieraxError(
            f"{where}: plan must be a preset ({', '.join(plan_lib.PRESETS)}), a plan file or a "
            f"plan mapping"
        )
    return files.load_plan(raw, cfg)


# How a train config spells what a plan records (for merge_planned_for's messages).
_CONFIG_KEYS = {k: k for k in ("mesh", "microbatch", "grad_accum", "seq")}


def _merge_planned(plan: plan_lib.Plan, given: dict, defaults: dict, source: str) -> dict:
    """The run's values of ``given``'s keys merged with what ``plan`` was planned for, through the
    one merge every verb uses (:func:`tierax.plan.merge_planned_for`): a value the config gives
    that differs from the plan's is refused, one it leaves out is the plan's, else the default."""
    try:
        values, _ = plan_lib.merge_planned_for(
            plan.planned_for, given, defaults, plan=repr(plan.name), flags=_CONFIG_KEYS
        )
    except TieraxError as e:
        raise TieraxError(f"{source}: {e}") from None
    return values


def _check_planned_model(plan: plan_lib.Plan, raw: Any, overrides: Sequence[str], source: str):
    """A named model must be the one ``plan`` records (a config mapping is not compared: a plan
    records a model file by the digest of its bytes)."""
    from tierax.plan.planned_for import DIGEST_PREFIX, model_name

    recorded = plan.planned_for.model
    if recorded is None or recorded.startswith(DIGEST_PREFIX) or not isinstance(raw, str):
        return
    mine = model_name(raw, list(overrides))
    if mine != recorded:
        raise TieraxError(
            f"{source}: model {mine!r} differs from the model plan {plan.name!r} was planned for "
            f"({recorded!r}); train that model, or plan again for this one"
        )


def parse_overrides(overrides: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``KEY=VALUE`` strings → (dotted key split, YAML scalar value)."""
    out = []
    for text in overrides:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise TieraxError(
                f"override {text!r}: expected KEY=VALUE, e.g. steps=100 or mesh.fsdp=4"
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        out.append((key.split("."), value))
    return out


def config_from_mapping(
    data: Any, overrides: Sequence[str] = (), *, source: str = "config"
) -> TrainConfig:
    """Validate a config mapping (as read from YAML), ``overrides`` applied in order.

    Raises:
      TieraxError: not a mapping, an unknown key (valid keys listed), a wrong type,
        or inconsistent values.
    """
    if not isinstance(data, Mapping):
        raise TieraxError(
            f"{source}: a train config must be a mapping of keys to values; valid keys: "
            + ", ".join(_TOP_KEYS)
        )
    data = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    model_overrides: list[str] = []
    for (path, value), text in zip(parse_overrides(overrides), overrides, strict=False):
        head = path[0]
        if head == "model" and len(path) == 2 and not isinstance(data.get("model"), Mapping):
            model_overrides.append(f"{path[1]}={text.partition('=')[2]}")  # onto the named config
        elif len(path) == 1:
            if head not in _TOP_KEYS:  # the command line's, not the file's
                raise unknown_keys([head], valid_keys(), f"command-line override {text!r}")
            data[head] = value
        elif len(path) == 2 and head in SECTIONS and ".".join(path) not in valid_keys():
            own = [k.split(".", 1)[1] for k in valid_keys() if k.startswith(f"{head}.")]
            raise unknown_keys(
                [path[1]], own, f"command-line override {text!r}", prefix=f"{head}."
            )
        elif len(path) == 2 and (head in SECTIONS or head == "model"):
            section = data.get(head)
            data[head] = {**(section if isinstance(section, Mapping) else {}), path[1]: value}
        elif head in SECTIONS or head == "model":
            raise TieraxError(
                f"override {text!r}: sections are one level deep, e.g. {head}.KEY=VALUE"
            )
        else:
            raise unknown_keys(
                [".".join(path)], valid_keys(), f"command-line override {text!r}"
            )

    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise unknown_keys(unknown, valid_keys(), source)
    scalars: dict[str, tuple[type, bool]] = {
        "microbatch": (int, True),
        "global_batch": (int, True),
        "seq": (int, False),
        "grad_accum": (int, False),
        "steps": (int, False),
        "seed": (int, False),
        "compute_dtype": (str, False),
        "cpu_devices": (int, True),
        "xla_preset": (str, False),
    }
    values = {k: scalar(k, data[k], t, source) for k, t in scalars.items() if k in data}
    compute_dtype = values.pop("compute_dtype", "model")
    _check(
        compute_dtype in COMPUTE_DTYPES,
        f"{source}: compute_dtype={compute_dtype!r} is unknown; use one of: "
        f"{', '.join(COMPUTE_DTYPES)} "
        "(model: the model config's own dtype)",
    )
    if "model" not in data:
        raise TieraxError(
            f"{source}: 'model' is required: a named config (see `tierax models`) or a model "
            f"mapping"
        )
    sections = {name: _section(name, data.get(name), source) for name in SECTIONS}
    try:
        model = _model(data["model"], model_overrides, compute_dtype, source)
        plan = _plan(data.get("plan", "save-all"), model, source)
    except TieraxError as e:
        msg = str(e)
        raise TieraxError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    _check_planned_model(plan, data["model"], model_overrides, source)
    merged = _merge_planned(
        plan,
        {"mesh": sections["mesh"].to_dict() if data.get("mesh") is not None else None},
        {"mesh": sections["mesh"].to_dict()},
        source,
    )
    sections["mesh"] = MeshShape(**merged["mesh"])
    mesh = sections["mesh"]

    # global_batch is an alternative spelling of the per-device microbatch.
    ways = "×".join(BATCH_AXES)
    microbatch, global_batch = values.pop("microbatch", None), values.pop("global_batch", None)
    if global_batch is not None:
        _check(global_batch >= 1, f"{source}: global_batch must be ≥ 1, got {global_batch}")
        _check(
            global_batch % mesh.batch_ways == 0,
            f"{source}: global_batch {global_batch} is not divisible by {ways} = "
            f"{mesh.batch_ways}; use a multiple of {mesh.batch_ways}, or set microbatch (sequences "
            f"per device) instead",
        )
        _check(
            microbatch is None or microbatch * mesh.batch_ways == global_batch,
            f"{source}: microbatch {microbatch} × {ways} {mesh.batch_ways} = "
            f"{(microbatch or 0) * mesh.batch_ways} ≠ global_batch {global_batch}; give one of "
            f"them",
        )
        microbatch = global_batch // mesh.batch_ways
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    merged = _merge_planned(
        plan,
        {"microbatch": microbatch, **{k: values.get(k) for k in ("grad_accum", "seq")}},
        {k: defaults[k] for k in ("microbatch", "grad_accum", "seq")},
        source,
    )
    values.update({k: v for k, v in merged.items() if v is not None})

    cfg = TrainConfig(model=model, plan=plan, source=source, **values, **sections)
    return cfg


def load_train_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read and validate a train config YAML file, then apply ``overrides``.

    Raises:
      TieraxError: the file is missing or not YAML, or the config is invalid
        (see :func:`config_from_mapping`).
    """
    data = read_yaml(path, "train config", "see configs/demo-train.yaml for an example")
    return config_from_mapping(data, overrides, source=str(path))


def config_to_yaml(cfg: TrainConfig) -> str:
    """``cfg.to_dict()`` as YAML: a file :func:`load_train_config` reads back to ``cfg``."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
