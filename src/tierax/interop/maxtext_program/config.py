"""A MaxText configuration loaded exactly as MaxText loads it (its own ``pyconfig``), with tierax's
sizing flags mapped onto MaxText's keys and the features tierax cannot price refused.

Two kinds of file are accepted:

* a **MaxText config** (``base.yml``, or any file with ``base_config:`` or ``model_name:``): given
  to MaxText's loader as its config file, the ``key=value`` overrides after it, as
  ``python -m maxtext.trainers.pre_train.train CONFIG key=value ...`` would;
* a **model file** (``configs/models/NAME.yml``: partial, neither key): loaded the way MaxText loads
  ``model_name=NAME`` — ``base.yml``, then the model file, then the overrides, MaxText refusing an
  override of a key the model file sets.  A model file outside MaxText's ``configs/models`` is
  placed (linked) under a temporary ``models/`` folder beside a link to MaxText's ``base.yml``, so
  MaxText's own lookup finds it; the model name is the file's stem.

What MaxText needs to build its model on a CPU without a cloud is set unless the user gave that key
(:data:`CPU_RUN`): ``hardware=cpu`` (so the traced program is MaxText's CPU program: attention
``autoselected`` is its ``dot_product`` kernel), synthetic data, no checkpointing, no
``jax.distributed``, and a run name and output directory in a temporary folder that is removed.

MaxText's ``pyconfig.initialize`` exits the process on a bad config outside pytest; this module
calls the function it wraps (``_initialize_pydantic``) and passes MaxText's error on as a
TieraxError.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import yaml

from tierax.errors import TieraxError

INSTALL = (
    "install MaxText: `make venv` (Python ≥ 3.12; it installs MaxText 0.2.5 as the maxtext extra), "
    "or `pip install 'maxtext[tpu]==0.2.5'` into a Python ≥ 3.12 environment"
)
# Set for a CPU run unless the user gave the key (run_name/base_output_directory: the temp folder).
CPU_RUN = {
    "hardware": "cpu",
    "dataset_type": "synthetic",
    "enable_checkpointing": "false",
    "skip_jax_distributed_system": "true",
}
# tierax's mesh axes → MaxText's mesh axis names (its ici_*/dcn_* keys follow them, except stage).
TIERAX_AXES = ("data", "fsdp", "tensor", "expert")
# MaxText mesh axis → the parallelism key stem (base.yml: ici_pipeline_parallelism for "stage").
_KEY_STEM = {"stage": "pipeline"}
# Logical activation axes every tensor-parallel figure is divided by (base.yml maps each to tensor).
TENSOR_SHARDED_ACTIVATIONS = ("activation_embed", "activation_heads", "activation_mlp")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


@dataclass(frozen=True)
class Loaded:
    """A loaded MaxText config (``HyperParameters``) and what tierax reads of it."""

    config: object  # maxtext.configs.pyconfig.HyperParameters
    model: str  # the model name (model_name, else the file's stem)
    mesh: dict  # tierax's axes: data, fsdp, tensor, expert (ici × dcn)
    microbatch: int  # sequences per device of the batch axes: per_device_batch_size × tensor
    seq: int


def require_maxtext():
    """MaxText's ``pyconfig`` module, imported here (lazily: tierax runs without MaxText).

    Raises:
      TieraxError: MaxText is not importable, naming what to install.
    """
    os.environ.setdefault("DECOUPLE_GCLOUD", "TRUE")  # MaxText's switch: no Google Cloud clients
    try:
        from maxtext.configs import pyconfig
    except ImportError as e:
        raise TieraxError(
            f"--maxtext needs MaxText, which is not importable here ({e}); {INSTALL}"
        ) from None
    return pyconfig


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``key=value`` strings → {key: value} (MaxText's own loader parses the values).

    Raises:
      TieraxError: an item that is no ``key=value``, or a key given twice.
    """
    out: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not _KEY.fullmatch(key):
            raise TieraxError(
                f"MaxText override {item!r} is no key=value; write e.g. per_device_batch_size=4 "
                "(MaxText's keys: configs/base.yml)"
            )
        if key in out and out[key] != value:
            raise TieraxError(
                f"MaxText key {key} is given twice ({out[key]!r}, {value!r}); give it once"
            )
        out[key] = value
    return out


def maxtext_keys(pyconfig) -> set[str]:
    """Every key MaxText's config takes: the fields of its ``MaxTextConfig``, nested ones too (a key
    outside them MaxText ignores with a warning, then fails on elsewhere)."""
    out: set[str] = set()

    def add(fields) -> None:
        for name, field in fields.items():
            out.add(name)
            inner = getattr(getattr(field, "annotation", None), "model_fields", None)
            if inner:
                add(inner)

    add(pyconfig.types.MaxTextConfig.model_fields)
    return out


def check_keys(keys: Sequence[str], pyconfig) -> None:
    """Refuse a key MaxText does not have, before MaxText's loader sees it.

    Raises:
      TieraxError: naming the key and the closest of MaxText's keys.
    """
    import difflib

    known = maxtext_keys(pyconfig)
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise TieraxError(
                f"MaxText has no key {key!r}{hint}; its keys are those of its configs/base.yml "
                f"({pathlib.Path(pyconfig.MAXTEXT_CONFIGS_DIR) / 'base.yml'})"
            )


def flag_keys(
    *,
    mesh: Mapping[str, int] | None = None,
    microbatch: int | None = None,
    seq: int | None = None,
    grad_accum: int | None = None,
) -> dict[str, tuple[str, str]]:
    """The MaxText keys tierax's flags set: {key: (value, the flag that set it)}.

    ``--mesh``: each axis inside one slice (``ici_{axis}_parallelism``; ``dcn_{axis}_parallelism``
    1); ``--microbatch`` (sequences per device of the batch axes) → ``per_device_batch_size`` =
    microbatch ÷ tensor (MaxText counts every device; a tensor group shares its sequences);
    ``--seq`` → ``max_target_length``; ``--grad-accum`` → ``gradient_accumulation_steps``.
    """
    out: dict[str, tuple[str, str]] = {}
    tensor = int((mesh or {}).get("tensor", 1))
    if mesh is not None:
        text = ",".join(f"{a}={int(mesh.get(a, 1))}" for a in TIERAX_AXES)
        for axis in TIERAX_AXES:
            out[f"ici_{axis}_parallelism"] = (str(int(mesh.get(axis, 1))), f"--mesh {text}")
            out[f"dcn_{axis}_parallelism"] = ("1", f"--mesh {text}")
    if microbatch is not None:
        per = microbatch / tensor
        out["per_device_batch_size"] = (
            str(int(per)) if per == int(per) else repr(per),
            f"--microbatch {microbatch}" + (f" (÷ tensor {tensor})" if tensor > 1 else ""),
        )
    if seq is not None:
        out["max_target_length"] = (str(seq), f"--seq {seq}")
    if grad_accum is not None:
        out["gradient_accumulation_steps"] = (str(grad_accum), f"--grad-accum {grad_accum}")
    return out


def merge_flags(user: Mapping[str, str], flags: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """``user``'s key=value overrides with the flags' keys added.

    Raises:
      TieraxError: a key given both ways with different values, naming both.
    """
    out = dict(user)
    for key, (value, flag) in flags.items():
        if key in user and not same(user[key], value):
            raise TieraxError(
                f"{flag} sets MaxText's {key}={value}, but {key}={user[key]} is given too; "
                "give one of them (or the same value)"
            )
        out.setdefault(key, value)
    return out


def same(a: str, b: str) -> bool:
    """Whether two MaxText values given as text are the same value (numbers by value, words by
    spelling, case aside)."""
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip().lower() == b.strip().lower()


def _read_yaml(path: pathlib.Path) -> Mapping:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TieraxError(f"--maxtext {path}: cannot read it as YAML ({e})") from None
    if not isinstance(data, Mapping):
        raise TieraxError(f"--maxtext {path}: not a MaxText config (no mapping of keys)")
    return data


def _is_config(data: Mapping) -> bool:
    """A MaxText config (``base_config:`` or ``model_name:``), not a partial model file."""
    return "base_config" in data or "model_name" in data


def command_config(path: str) -> tuple[list[str], str | None]:
    """What MaxText's own command line (``python -m maxtext.trainers.pre_train.train``) starts
    with to load ``path`` as :func:`load` does: a MaxText config itself; for a model file
    ``<MaxText's configs>/base.yml model_name=NAME`` (MaxText reads a model file only through
    ``model_name``, over ``base.yml``: given alone it has none of ``base.yml``'s keys).  With a note
    where MaxText would not find that model file (it looks in its ``configs/models`` only).

    Raises:
      TieraxError: MaxText missing, or ``path`` unreadable.
    """
    pyconfig = require_maxtext()
    file = pathlib.Path(path)
    data = _read_yaml(file)
    if _is_config(data):
        return [str(file)], None
    configs = pathlib.Path(pyconfig.MAXTEXT_CONFIGS_DIR)
    model = file.stem
    known = configs / "models" / f"{model}.yml"
    argv = [str(configs / "base.yml"), f"model_name={model}"]
    if known.is_file() and known.resolve() == file.resolve():
        return argv, None
    return argv, (
        f"MaxText reads model_name={model} from {known} only: place {file} there first"
        + (" (a different file of that name is there now)" if known.exists() else "")
    )


@contextlib.contextmanager
def _argv(path: str, user: Mapping[str, str], pyconfig) -> Iterator[tuple[list[str], str, str]]:
    """MaxText's command line for ``path`` (see the module docstring), the model name and the
    temporary folder (removed on exit)."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise TieraxError(f"--maxtext {path}: no such file; give a MaxText config or model file")
    if file.suffix != ".yml":
        raise TieraxError(
            f"--maxtext {path}: MaxText reads a config file only by a .yml name; rename it"
        )
    data = _read_yaml(file)
    configs = pathlib.Path(pyconfig.MAXTEXT_CONFIGS_DIR)
    tmp = tempfile.mkdtemp(prefix="tierax-maxtext-")
    try:
        if _is_config(data):
            argv = ["tierax", str(file)]
            model = str(user.get("model_name", data.get("model_name", "default")))
            if model == "default":
                model = file.stem
        else:  # a partial model file: base.yml + model_name, as MaxText loads it
            if "model_name" in user:
                raise TieraxError(
                    f"--maxtext {path} is a model file (model {file.stem}) and model_name="
                    f"{user['model_name']} is given too; give the model one way: --maxtext "
                    f"<configs>/base.yml model_name=NAME, or the model file alone"
                )
            model = file.stem
            known = configs / "models" / f"{model}.yml"
            if known.is_file() and known.resolve() == file.resolve():
                base = configs / "base.yml"
            else:
                (pathlib.Path(tmp) / "models").mkdir()
                base = pathlib.Path(tmp) / "base.yml"
                base.symlink_to(configs / "base.yml")
                (pathlib.Path(tmp) / "models" / f"{model}.yml").symlink_to(file.resolve())
            argv = ["tierax", str(base), f"model_name={model}"]
        yield argv, model, tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def load(
    path: str,
    overrides: Sequence[str] = (),
    *,
    mesh: Mapping[str, int] | None = None,
    microbatch: int | None = None,
    seq: int | None = None,
    grad_accum: int | None = None,
) -> Iterator[Loaded]:
    """MaxText's config of ``path`` with ``overrides`` (``key=value``) and tierax's flags (None: not
    given; the config's value stands), checked for what tierax can price.  A context manager: the
    temporary run folder is removed on exit.

    Raises:
      TieraxError: MaxText missing; a missing/unreadable file; a bad override; a flag conflicting
        with a key; MaxText's own validation error (its message names the key); a feature tierax
        cannot price (:func:`check_priceable`).
    """
    pyconfig = require_maxtext()
    user = parse_overrides(overrides)
    check_keys(list(user), pyconfig)
    keys = merge_flags(
        user, flag_keys(mesh=mesh, microbatch=microbatch, seq=seq, grad_accum=grad_accum)
    )
    with _argv(path, user, pyconfig) as (argv, model, tmp):
        extra = {k: v for k, v in CPU_RUN.items() if k not in keys}
        if "run_name" not in keys:
            extra["run_name"] = "tierax-inventory"
        if "base_output_directory" not in keys:
            extra["base_output_directory"] = tmp
        argv = [*argv, *(f"{k}={v}" for k, v in {**keys, **extra}.items())]
        try:
            # pyconfig.initialize wraps this and exits the process on an error outside pytest.
            config = pyconfig.HyperParameters(pyconfig._initialize_pydantic(argv))
        except Exception as e:  # MaxText's validation: pydantic, ValueError, AssertionError ...
            raise TieraxError(f"MaxText refused the configuration {path}: {_short(e)}") from None
        loaded = _read(config, model)
        yield loaded


def _short(e: Exception) -> str:
    text = " ".join(str(e).split())
    return (text[:600] + " …") if len(text) > 600 else text


def _size(v: int) -> int:
    return 1 if v == -1 else int(v)  # MaxText's -1: "the rest" of the devices, here one device


def _read(config, model: str) -> Loaded:
    check_priceable(config)
    sizes = {}
    for axis, ici, dcn in _axes(config):
        sizes[axis] = _size(ici) * _size(dcn)
    mesh = {a: sizes.get(a, 1) for a in TIERAX_AXES}
    per = float(config.per_device_batch_size)
    micro = per * mesh["tensor"]
    if micro < 1 or abs(micro - round(micro)) > 1e-9:
        raise TieraxError(
            f"per_device_batch_size {config.per_device_batch_size} × tensor {mesh['tensor']} is "
            "no whole number ≥ 1 of sequences per device of the batch axes; tierax traces one "
            "device's sequences: give a per_device_batch_size that makes it whole"
        )
    return Loaded(config, model, mesh, round(micro), int(config.max_target_length))


def check_priceable(config) -> None:
    """Refuse what the cost model cannot price, naming the key (never priced as something else).

    * pipeline parallelism (``ici_pipeline_parallelism``/``dcn_pipeline_parallelism`` > 1): MaxText
      runs its layers as pipeline stages over microbatches (gPipe/circular); tierax prices one
      SPMD program in which every device runs every layer, with no stage bubble or per-stage
      memory;
    * mesh axes other than data, fsdp, tensor and expert above 1 (context, sequence,
      fsdp_transpose, ...): their collectives and activation splits are not modelled;
    * ``scan_layers=false``: MaxText then runs each layer as its own checkpointed call; tierax
      plans per scanned layer group (one scan's layers placed alike, its carry the checkpoint);
    * a decoder whose layers are not all in the scanned stacks traced here (multi-token
      prediction, engram layers, DeepSeek's batch-split schedule, lineage, multimodal encoders)
      or whose scanned block rematerialises its sub-layers itself (gemma4, qwen3_next), or that
      cannot scan (gemma4_small), or whose hash layers run unscanned (deepseek4);
    * tensor parallelism under logical axis rules that do not shard every layer activation over
      ``tensor`` (the figures are divided by the tensor axis: see :mod:`.trace`).
    """
    for axis, ici, dcn in _axes(config):
        if axis in TIERAX_AXES or (ici in (1, -1) and dcn in (1, -1)):
            continue
        stem = _KEY_STEM.get(axis, axis)
        given = ", ".join(
            f"{part}_{stem}_parallelism={v}" for part, v in (("ici", ici), ("dcn", dcn)) if v != 1
        )
        if axis == "stage":
            raise TieraxError(
                f"{given}: pipeline parallelism is not priced: MaxText runs its layers as "
                "pipeline stages over microbatches, and tierax's cost model prices one SPMD "
                "program in which every device runs every layer (no stage bubble, no per-stage "
                "memory); set it to 1 to plan the run without pipelining"
            )
        raise TieraxError(
            f"{given}: tierax models only the {', '.join(TIERAX_AXES)} mesh axes (the {axis} "
            "axis's collectives and activation split are not modelled); set it to 1"
        )
    if not config.scan_layers:
        raise TieraxError(
            "scan_layers=false: MaxText then runs each layer as its own checkpointed call, and "
            "tierax plans per scanned layer group; set scan_layers=true"
        )
    refusals = {
        "mtp_num_layers": "multi-token prediction's layers run outside the decoder's scans",
        "engram_layers": "engram layers run unscanned between DeepSeek's scanned chunks",
        "use_batch_split_schedule": "DeepSeek's batch-split schedule replaces the MoE layer stack",
        "use_lineage": "lineage replaces DeepSeek's layer stacks",
        "use_multimodal": "the vision/audio encoders are not traced",
        "use_audio": "the audio encoder is not traced",
    }
    for key, why in refusals.items():
        if getattr(config, key, None):
            raise TieraxError(
                f"{key}={getattr(config, key)!r} is not priced ({why}); leave it unset"
            )
    block = str(getattr(config.decoder_block, "value", config.decoder_block))
    blocks = {
        "gemma4": "its scanned block rematerialises its own sub-layers",
        "qwen3_next": "its scanned block rematerialises its own sub-layers",
        "gemma4_small": "its layers cannot be scanned",
        "deepseek4": "its hash layers run unscanned before the scanned blocks",
    }
    if block in blocks:
        raise TieraxError(
            f"decoder_block {block} is not traced yet: {blocks[block]}; tierax traces scanned "
            "layer stacks whose layer MaxText checkpoints as a whole"
        )
    tensor = _axis_size(config, "tensor")
    if tensor > 1:
        rules = {}
        for name, axes in config.logical_axis_rules:
            rules.setdefault(name, axes)
        unsharded = [
            n for n in TENSOR_SHARDED_ACTIVATIONS if "tensor" not in _as_tuple(rules.get(n))
        ]
        if unsharded:
            raise TieraxError(
                f"tensor parallelism {tensor} with logical_axis_rules that do not shard "
                f"{', '.join(unsharded)} over tensor: tierax divides every layer figure by the "
                "tensor axis, which holds under MaxText's base.yml rules only; use those rules"
            )


def _as_tuple(axes) -> tuple:
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def _axes(config):
    """(mesh axis, ici size, dcn size) of each of MaxText's mesh axes."""
    return zip(config.mesh_axes, config.ici_parallelism, config.dcn_parallelism, strict=True)


def _axis_size(config, axis: str) -> int:
    i = list(config.mesh_axes).index(axis)
    return _size(config.ici_parallelism[i]) * _size(config.dcn_parallelism[i])


def embedding_shards(inv) -> int:
    """The ways MaxText shards the embedding and head of an inventory's mesh (fsdp × expert, as its
    base.yml rules): the loss rules' ``fsdp`` (:mod:`.loss_terms`, :mod:`.tpu_terms`)."""
    return int(inv.mesh.get("fsdp", 1)) * int(inv.mesh.get("expert", 1))


def maxtext_importable() -> bool:
    """Whether MaxText can be imported here (without importing it)."""
    if "maxtext" in sys.modules:
        return sys.modules["maxtext"] is not None
    import importlib.util

    return importlib.util.find_spec("maxtext") is not None
