"""A tierax Plan written as MaxText overrides: the YAML a MaxText run starts from.

MaxText's ``remat_policy: custom`` takes one of ``remat | device | offload`` per
activation name (:mod:`tierax.interop.maxtext_keys`), once for every layer.  A plan
whose layer groups place the same name differently therefore has no MaxText form:
:func:`uniform_placements` refuses it naming the conflict (``tierax plan --for
maxtext`` solves under that restriction instead).

The file (:func:`overrides_yaml`) inherits ``base.yml`` (``base_config``), so it is a
MaxText config on its own: ``python -m maxtext.trainers.pre_train.train FILE
run_name=...``.  It holds the model (MaxText's model keys, :func:`model_keys`), the
plan, ``per_device_batch_size``, ``max_target_length``, ``scan_layers``, the mesh
(``ici_*_parallelism`` inside one NVLink domain, ``dcn_*_parallelism`` across domains, as
tierax lays the devices out), the MoE settings tierax modelled
(capacity-factor dispatch: ``sparse_matmul: false``), the loss tiling
(``num_vocab_tiling``), and — as comment lines, since MaxText reads them from the
environment, not the config — the XLA flags of the schedule and the runtime
variables (``XLA_PYTHON_CLIENT_MEM_FRACTION``, ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB``).
Key names are MaxText's (``configs/base.yml``, ``configs/models/*.yml``).
"""

from __future__ import annotations

import math
import pathlib
import shlex
from collections.abc import Mapping

import yaml

from tierax import hardware
from tierax import names as N
from tierax.errors import TieraxError
from tierax.interop import maxtext_keys as K
from tierax.interop.maxtext_keys import model_keys
from tierax.launch import flags as xla_flags
from tierax.mesh import MeshShape
from tierax.models.config import for_platform
from tierax.plan import Placement, Plan, resolve, unnamed_placements

# tierax schedule (cost model) → XLA flag preset (tierax.launch.flags.PRESETS).
SCHEDULE_PRESET = {"serial": "none", "lhs": "lhs", "lhs-pipelined": "lhs-pipelined"}
MESH_KEYS = {"data": "data", "fsdp": "fsdp", "tensor": "tensor", "expert": "expert"}
GPUS_PER_PROCESS = 8  # MaxText on GPUs: one process per 8-GPU node
MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
HOST_LIMIT = "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"


def conflicts(plan: Plan, cfg) -> dict[str, dict[str, Placement]]:
    """Names placed differently by different layer groups: name → {group: placement}."""
    by_name: dict[str, dict[str, Placement]] = {}
    for group, placements in resolve(plan, cfg).items():
        for name, p in placements.items():
            by_name.setdefault(name, {})[group] = p
    return {n: g for n, g in by_name.items() if len(set(g.values())) > 1}


def check_maxtext_names(plan: Plan | str) -> None:
    """Every name ``plan`` places is one of MaxText's ``remat_policy: custom`` keys (``plan``: a
    Plan, or a plan YAML file, read without a model so that this refusal comes first; a preset or
    a MaxText override file carries MaxText's names only and passes).

    Raises:
      TieraxError: names MaxText has no key for (a model's own ``checkpoint_name`` tags), each
        named, with MaxText's keys.
    """
    if isinstance(plan, str):
        path = pathlib.Path(plan)
        if not path.is_file():
            return  # a preset (or a missing file, which loading the plan refuses)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, yaml.YAMLError):
            return  # loading the plan says what is wrong with the file
        if K.is_override_file(data):
            return
        plan = Plan.from_dict(data, source=str(path))
    named = [
        n
        for gp in plan.groups.values()
        for n in [*gp.placements, *(m for seg in gp.segments for m in seg.placements)]
    ]
    foreign = list(dict.fromkeys(n for n in named if n not in K.REMAT_KEYS))
    if foreign:
        raise TieraxError(
            f"plan {plan.name!r} places {', '.join(map(repr, foreign))}, which MaxText has no "
            f"remat_policy key for (MaxText's keys: {', '.join(K.REMAT_KEYS)}); MaxText "
            "overrides can only carry those names: plan a tierax model, or apply this plan "
            "with tierax.api.policy in your own model"
        )


def uniform_placements(plan: Plan, cfg) -> dict[str, Placement]:
    """One placement per activation name, as MaxText needs.

    Raises:
      TieraxError: the plan places a name differently in two layer groups (named, with
        each group's placement), or keeps ``decoder_layer_input`` out of device/offload.
    """
    bad = conflicts(plan, cfg)
    if bad:
        what = "; ".join(
            f"{n}: " + ", ".join(f"{p.value} in {g}" for g, p in groups.items())
            for n, groups in bad.items()
        )
        raise TieraxError(
            f"plan {plan.name!r} is not expressible in MaxText, which sets each name once for all "
            f"layers: {what}. "
            "Plan with `tierax plan --for maxtext` (one placement per name), or edit the plan so "
            "the groups agree"
        )
    out = {n: p for groups in resolve(plan, cfg).values() for n, p in groups.items()}
    if out.get(N.DECODER_LAYER_INPUT) is Placement.REMAT:
        raise TieraxError(
            f"plan {plan.name!r} recomputes decoder_layer_input, which MaxText refuses (it is the "
            "layer's checkpoint); place it on device or offload it"
        )
    return out


# tierax's attention → MaxText's ``attention`` kernel: cuDNN's fused attention through JAX (what
# tierax's ``cudnn`` calls), the materialising XLA form, and MaxText's ``flash``, which on a TPU
# is the splash-attention Pallas kernel tierax's ``splash`` calls.  tierax's ``blockwise`` has no
# MaxText counterpart: the key is left to MaxText's default and the file says so.
MAXTEXT_ATTENTION = {"cudnn": "cudnn_flash_jax", "xla": "dot_product", "splash": "flash"}


def runtime_env(
    *,
    target: str,
    schedule: str,
    devices: int,
    budget_bytes: float | None = None,
    capacity_bytes: float | None = None,
    host_bytes: float | None = None,
) -> tuple[dict, list[str]]:
    """(environment variables, why-lines) a MaxText run of the plan needs; XLA reads them at
    start-up."""
    if schedule not in SCHEDULE_PRESET:
        raise TieraxError(
            f"unknown schedule {schedule!r}; choose one of: {', '.join(SCHEDULE_PRESET)}"
        )
    env, why = {}, []
    if target != "cpu" and hardware.get_target(target).kind == "tpu":
        # The schedule presets are XLA:GPU flags, and the two variables are read by the GPU client;
        # libtpu gets the step's TPU options, under which the plan's memory was modelled.
        env[xla_flags.LIBTPU_ARGS] = " ".join(xla_flags.TPU_FLAGS)
        return env, [
            (
                f"TPU ({target}): no XLA_FLAGS, {MEM_FRACTION} or {HOST_LIMIT}: those are "
                "for XLA:GPU and its client (XLA:TPU runs its own latency-hiding scheduler)"
            ),
            (
                f"{xla_flags.LIBTPU_ARGS}: the LM head's gradient reduction as one collective, "
                "not a windowed einsum (which holds a second logits-sized buffer where XLA:TPU "
                "picks it); the plan's memory was modelled so (append to any flags you set)"
            ),
        ]
    flags = xla_flags.PRESETS[SCHEDULE_PRESET[schedule]]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
        why.append(f"XLA_FLAGS: schedule {schedule} (append to any flags you already set)")
    if target == "cpu":
        why.append("CPU: no memory fraction or host limit (offloading is a no-op on XLA:CPU)")
        return env, why
    if budget_bytes and capacity_bytes:
        env[MEM_FRACTION] = (
            f"{min(0.95, max(0.01, math.ceil(100 * budget_bytes / capacity_bytes) / 100)):.2f}"
        )
        why.append(
            f"{MEM_FRACTION}: device budget "
            + (
                f"{budget_bytes / 2**30:.1f} GiB"
                if budget_bytes >= 2**30
                else f"{budget_bytes / 2**20:.1f} MiB"  # a small budget is not "0.0 GiB"
            )
            + " of "
            f"{capacity_bytes / 2**30:.0f} GiB "
            "(JAX preallocates 75 % by default)"
        )
    if host_bytes:
        local = min(devices, GPUS_PER_PROCESS)
        env[HOST_LIMIT] = str(max(1, math.ceil(host_bytes * local * 1.25 / 1e9)))
        why.append(
            f"{HOST_LIMIT}: {host_bytes / 1e9:.2f} GB offloaded per device × {local} devices per "
            f"process + 25 %"
        )
    elif host_bytes is None:
        why.append(
            f"{HOST_LIMIT}: not derived (no sizes given); `tierax plan --emit maxtext` derives it"
        )
    return env, why


# The environment variables that carry XLA's flags (what modelled_flags returns).
FLAG_VARIABLES = (xla_flags.LIBTPU_ARGS, "XLA_FLAGS")


def modelled_flags(target: str, schedule: str = "lhs") -> dict[str, str]:
    """The libtpu/XLA flags tierax models MaxText's program under on ``target`` (and, on a GPU,
    ``schedule``), as the environment variables that carry them: what a MaxText run must set for
    a prediction to be about its program, what ``compile --maxtext`` compiles with by default and
    what ``--emit maxtext`` writes (:func:`runtime_env`'s flags, less its sizes)."""
    env, _ = runtime_env(target=target, schedule=schedule, devices=1)
    return {k: v for k, v in env.items() if k in FLAG_VARIABLES}


def flags_text(env: Mapping[str, str]) -> str:
    """``env``'s flag variables as the shell lines that set them ("none" where there are none)."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items() if k in FLAG_VARIABLES]
    return "; ".join(lines) or "none"


def overrides(
    plan: Plan,
    cfg,
    *,
    microbatch: int,
    seq: int,
    mesh: Mapping[str, int],
    target: str = "h200",
    grad_accum: int = 1,
) -> dict:
    """The MaxText keys of a run of ``plan`` (mapping in file order; see the module docstring)."""
    check_maxtext_names(plan)
    kind = hardware.platform(target)  # unknown: refused
    cfg = for_platform(cfg, kind)  # attention: auto, as the target runs it
    MeshShape(**{a: int(v) for a, v in mesh.items()}).check_model(cfg, where="--mesh")
    placements = uniform_placements(plan, cfg)
    remat = {k: placements[k].value if k in placements else "remat" for k in K.REMAT_KEYS}
    if K.context_is_attention_out(kind) and N.ATTENTION_OUT in placements:
        # the fused kernel's residuals follow attention_out
        remat[K.CONTEXT] = remat[N.ATTENTION_OUT]
    out: dict = {"base_config": "base.yml", "hardware": kind}
    out.update(model_keys(cfg))
    if cfg.attention in MAXTEXT_ATTENTION:
        out["attention"] = MAXTEXT_ATTENTION[cfg.attention]
    out.update(
        {
            "remat_policy": "custom",
            **remat,
            "scan_layers": True,
            # MaxText: global batch = per_device_batch_size × devices; tierax's microbatch is per
            # device of the batch axes, which a tensor group shares.
            "per_device_batch_size": _per_device_batch(microbatch, mesh),
            "max_target_length": seq,
        }
    )
    if grad_accum > 1:  # MaxText: global batch = per_device_batch_size × devices × this
        out["gradient_accumulation_steps"] = grad_accum
    ici, dcn = _ici_dcn(mesh, kind, target)
    for axis, key in MESH_KEYS.items():
        out[f"ici_{key}_parallelism"] = ici[axis]
    for axis, key in MESH_KEYS.items():
        out[f"dcn_{key}_parallelism"] = dcn[axis]
    if getattr(cfg, "num_experts", 0) and getattr(cfg, "moe_impl", "capacity") == "ragged":
        # tierax's dropless grouped matmuls: MaxText's sparse (megablox) MoE, no capacity.
        out.update({"capacity_factor": -1.0, "sparse_matmul": True, "megablox": True})
    elif getattr(cfg, "num_experts", 0):
        out.update(
            {"capacity_factor": cfg.capacity_factor, "sparse_matmul": False, "megablox": False}
        )
    out["num_vocab_tiling"] = cfg.loss_tiles
    moments = {g.name: plan.state_of(g.name).moments for g in cfg.layer_groups()}
    # MaxText offloads the whole optimizer state or none of it: written true when every layer
    # group's moments are offloaded (state_notes says what differs).
    out[K.OPTIMIZER_OFFLOAD] = all(p is Placement.OFFLOAD for p in moments.values())
    out[K.PARAMETER_OFFLOAD] = False
    return out


def state_notes(plan: Plan, cfg) -> list[str]:
    """What of ``plan``'s training-state placements MaxText's two switches do not express."""
    notes = []
    groups = [g.name for g in cfg.layer_groups()]
    off = [g for g in groups if plan.state_of(g).moments is Placement.OFFLOAD]
    if off and len(off) == len(groups):
        notes.append(
            f"{K.OPTIMIZER_OFFLOAD}: true also offloads the embedding's and head's moments, "
            "which tierax's plan keeps on device"
        )
    elif off:
        notes.append(
            f"{K.OPTIMIZER_OFFLOAD}: false, though the plan offloads the moments of "
            f"{', '.join(off)} only: MaxText offloads all of the optimizer state or none; set it "
            "true to offload all (more device memory freed, more copies)"
        )
    masters = [g for g in groups if plan.state_of(g).master_weights is Placement.OFFLOAD]
    if masters:
        notes.append(
            f"{K.PARAMETER_OFFLOAD}: false, though the plan offloads the master weights of "
            f"{', '.join(masters)}: {K.PARAMETER_OFFLOAD_DIFFERS}"
        )
    accum = [g for g in groups if plan.state_of(g).grad_accum is Placement.OFFLOAD]
    if accum:
        notes.append(
            f"grad_accum: offload ({', '.join(accum)}) has no MaxText key; its accumulator stays "
            "on device"
        )
    return notes


def _per_device_batch(microbatch: int, mesh: Mapping[str, int]) -> int | float:
    t = int(mesh.get("tensor", 1))
    return microbatch // t if microbatch % t == 0 else microbatch / t


def _ici_dcn(mesh: Mapping[str, int], kind: str, target: str) -> tuple[dict, dict]:
    """Each axis's part inside one NVLink domain (``ici_*``) and across domains (``dcn_*``), laid
    out as tierax lays the devices (:func:`tierax.costmodel.network.ici_dcn`); a TPU slice or the
    CPU is one domain."""
    from tierax.costmodel import network

    full = {a: int(mesh.get(a, 1)) for a in MESH_KEYS}
    if kind != "gpu":
        return full, dict.fromkeys(full, 1)
    devices = math.prod(full.values())
    spec = hardware.get_target(target)
    per = network.devices_per_domain(devices, spec.nvlink_domain_gpus)
    return network.ici_dcn(full, per)


def overrides_yaml(
    plan: Plan,
    cfg,
    *,
    microbatch: int,
    seq: int,
    mesh: Mapping[str, int],
    schedule: str = "lhs",
    target: str = "h200",
    budget_bytes: float | None = None,
    capacity_bytes: float | None = None,
    host_bytes: float | None = None,
    notes: tuple[str, ...] = (),
    grad_accum: int = 1,
) -> str:
    """:func:`overrides` as a commented YAML file, the environment first (as ``export`` lines)."""
    cfg = for_platform(cfg, hardware.platform(target))
    keys = overrides(
        plan, cfg, microbatch=microbatch, seq=seq, mesh=mesh, target=target, grad_accum=grad_accum
    )
    devices = math.prod(int(v) for v in mesh.values())
    env, why = runtime_env(
        target=target,
        schedule=schedule,
        devices=devices,
        budget_bytes=budget_bytes,
        capacity_bytes=capacity_bytes,
        host_bytes=host_bytes,
    )
    lines = [
        f"{K.HEADER_NAME}{plan.name}",
        f"{K.HEADER_DESCRIPTION}{' '.join(plan.description.splitlines())}",
        f"# MaxText overrides written by tierax for {cfg.name} on {target}, {devices} devices, "
        f"schedule {schedule}.",
        "# Run: python -m maxtext.trainers.pre_train.train THIS_FILE run_name=RUN "
        "base_output_directory=DIR ...",
        "# Environment (XLA reads it when the backend starts; MaxText does not read it from this "
        "file):",
        *[f"#   export {k}={shlex.quote(v)}" for k, v in env.items()],
        *[f"#   ({w})" for w in why],
        "# Notes:",
        "#   MaxText names tierax does not model stay remat:",
        *[
            f"#     {k}: {v}"
            for k, v in K.NO_COUNTERPART.items()
            if k in K.REMAT_KEYS
            and not (k == K.CONTEXT and K.context_is_attention_out(keys["hardware"]))
        ],
        *(
            [
                f"#   {K.CONTEXT} follows attention_out: on {keys['hardware']} both name the fused "
                "attention's output"
            ]
            if K.context_is_attention_out(keys["hardware"])
            else []
        ),
        "#   MaxText's custom policy keeps the named tensors and recomputes every unnamed "
        "intermediate, as",
        "#   tierax's plans do unless a group says unnamed: device.",
    ]
    kept = sorted(g for g, p in unnamed_placements(plan, cfg).items() if p is Placement.DEVICE)
    if kept:
        lines += [
            f"#   NOT EXPRESSED: {', '.join(kept)} keep(s) every intermediate (unnamed: device, no "
            "remat); MaxText has",
            "#   no custom key for that and will recompute the unnamed intermediates there.",
        ]
    if getattr(cfg, "num_experts", 0) and getattr(cfg, "moe_impl", "capacity") != "ragged":
        lines += [
            "#   MoE: tierax models capacity-factor dispatch (dense per-expert buffers), hence",
            "#   sparse_matmul: false; MaxText's default is dropless megablox (capacity_factor: "
            "-1).",
        ]
    if cfg.attention not in MAXTEXT_ATTENTION:
        lines += [
            f"#   attention: tierax's {cfg.attention} attention has no MaxText kernel; MaxText's "
            "default (autoselected) applies"
        ]
    lines += [f"#   {n}" for n in (*state_notes(plan, cfg), *notes)]
    return "\n".join(lines) + "\n" + yaml.safe_dump(keys, sort_keys=False, default_flow_style=None)
