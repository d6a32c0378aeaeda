"""MaxText's own train step compiled for a target without the target's hardware, and read as tierax
reads a compile of its own step.

The program is MaxText's: its config loaded by MaxText's loader
(:mod:`tierax.interop.maxtext_program.config`), its abstract train state, batch and ``train_step``
built by the same MaxText functions its ahead-of-time compiler
(``maxtext.trainers.pre_train.train_compile``) calls, with the same options (the ``unsafe_rbg``
PRNG, MaxText's compile-time libtpu flags from ``compile_xla_flags``, and the libtpu option
:data:`tierax.launch.flags.MAXTEXT_TPU_FLAGS` it adds).  Only the devices differ by
platform:

* **TPU** targets (v5e, v5p, v6e, v7x): MaxText's own topology mesh for ``compile_topology`` (the
  MaxText slice name of the target and device count, e.g. ``v5p-16`` for 8 v5p chips), as
  ``train_compile`` builds it: its memory figures are the ones ``train_compile`` prints.
* **GPU** targets (h100, h200, b200, gb200): MaxText's GPU path needs the GPUs themselves
  (``jax.devices()``), so the mesh is MaxText's device mesh (``create_device_mesh``) over tierax's
  compile-only GPU devices (a GpuTargetConfigProto of the target,
  :func:`tierax.xla.compile.gpu_topology`), with ``hardware=gpu`` and MaxText's
  ``internal_compile_num_devices`` giving its batch arithmetic the device count.  MaxText's
  ``autoselected`` GPU attention is a kernel that checks the device kind while tracing and cannot be
  compiled without a GPU; unless the user names one, the compile uses ``cudnn_flash_jax`` (cuDNN's
  fused attention through JAX) and says so in its notes.

The result is a :class:`tierax.xla.result.CompileResult`: peak (arguments + outputs + temp −
aliased), host temp bytes, every host transfer with the static overlap check, or XLA's
out-of-memory refusal as a result that does not fit.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence

from tierax import hardware
from tierax.errors import TieraxError
from tierax.xla.result import CompileResult

# tierax's TPU target → the prefix of MaxText's slice names (maxtext.utils.accelerator_to_spec_map).
TPU_SLICE_PREFIX = {"v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "v7x": "tpu7x"}
# The GPU attention used where the user gives none (see the module docstring).
DEVICELESS_GPU_ATTENTION = "cudnn_flash_jax"


def compile_topology(target: str, devices: int) -> str:
    """MaxText's name of the slice of ``devices`` devices of TPU ``target`` (its
    ``compile_topology``).

    Raises:
      TieraxError: a target without MaxText slices, or no slice of that many devices (the sizes
        MaxText knows are named).
    """
    from maxtext.utils.accelerator_to_spec_map import UserFacingNameToSystemCharacteristics

    prefix = TPU_SLICE_PREFIX.get(target)
    if prefix is None:
        raise TieraxError(
            f"target {target!r} has no MaxText TPU slice; TPU targets: "
            + ", ".join(TPU_SLICE_PREFIX)
        )
    sizes = {
        spec.devices_per_slice: name
        for name, spec in sorted(
            UserFacingNameToSystemCharacteristics.items(), key=lambda kv: kv[1].devices_per_slice
        )
        if name.rpartition("-")[0] == prefix
    }
    if devices not in sizes:
        raise TieraxError(
            f"MaxText has no {target} slice of {devices} devices; its {prefix} slices hold "
            f"{', '.join(str(n) for n in sorted(sizes))} devices (give --devices one of them)"
        )
    return sizes[devices]


def target_keys(target: str, devices: int, user: Mapping[str, str]) -> dict[str, str]:
    """The MaxText keys that aim its program at ``target``'s ``devices`` devices.

    Raises:
      TieraxError: the user's own keys name another platform, slice or device count.
    """
    spec = hardware.get_target(target)
    if spec.kind == "tpu":
        keys = {
            "hardware": "tpu",
            "compile_topology": compile_topology(target, devices),
            "compile_topology_num_slices": "1",
        }
    elif spec.kind == "gpu":
        keys = {
            "hardware": "gpu",
            "internal_compile": "true",
            "internal_compile_num_devices": str(devices),
        }
        if "attention" not in user:
            keys["attention"] = DEVICELESS_GPU_ATTENTION
    else:
        raise TieraxError(
            f"compile --maxtext compiles for a TPU or GPU target; {target!r} is a {spec.kind}"
        )
    for key, value in keys.items():
        if key in user and str(user[key]).strip().lower() != value:
            raise TieraxError(
                f"--target {target} with {devices} devices sets MaxText's {key}={value}, but "
                f"{key}={user[key]} is given too; drop the key (the target sets it)"
            )
    if spec.kind == "gpu" and user.get("attention") == "autoselected":
        raise TieraxError(
            "attention=autoselected on a GPU is a kernel that checks the device while tracing, "
            "which a deviceless compile cannot; name one, e.g. "
            f"attention={DEVICELESS_GPU_ATTENTION}"
        )
    return keys


@contextlib.contextmanager
def _maxtext_compile_options():
    """The options MaxText's train_compile sets around its compile (its PRNG implementation),
    restored after."""
    import jax

    was = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", "unsafe_rbg")
    try:
        yield
    finally:
        jax.config.update("jax_default_prng_impl", was)


def _mesh(config, target: str, devices: int, target_config: str | None):
    """MaxText's device mesh over compile-only devices of ``target``."""
    from jax.sharding import AxisType, Mesh

    spec = hardware.get_target(target)
    if spec.kind == "tpu":
        from maxtext.trainers.pre_train.train_compile import get_topology_mesh

        if target_config is not None:
            raise TieraxError("--target-config is a GpuTargetConfigProto; a TPU target takes none")
        return get_topology_mesh(config)
    from maxtext.utils import maxtext_utils

    from tierax.hardware import cudnn
    from tierax.hardware.target_config import render_target_config, scheduling_target_config
    from tierax.xla.compile import gpu_topology

    text = scheduling_target_config(
        target_config or render_target_config(spec, cudnn=cudnn.installed_version() or (9, 10, 0))
    )
    topo = gpu_topology(text, devices, target)
    grid = maxtext_utils.create_device_mesh(config, topo.devices)
    return Mesh(grid, config.mesh_axes, axis_types=(AxisType.Auto,) * len(config.mesh_axes))


def _compiled(config, mesh):
    """MaxText's train step for ``config`` on ``mesh``, lowered and compiled (MaxText's functions,
    in train_compile's order)."""
    from flax.linen import partitioning as nn_partitioning
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    args, kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
        config, state_shardings
    )
    input_shardings = sharding.build_zero1_input_state_mesh_shardings(
        config, state_shardings, params_shardings
    )
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    fn, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data_sharding, input_shardings, model, config, params_shardings
    )
    return train_compile.jit_and_compile(
        fn,
        args,
        kwargs,
        mesh,
        in_shard,
        out_shard,
        static,
        donate,
        config,
        nn_partitioning.axis_rules(config.logical_axis_rules),
    )


def compile_program(
    path: str,
    overrides: Sequence[str] = (),
    *,
    target: str,
    devices: int,
    mesh: Mapping[str, int] | None = None,
    microbatch: int | None = None,
    seq: int | None = None,
    grad_accum: int | None = None,
    target_config: str | None = None,
) -> tuple[CompileResult, str]:
    """Compile MaxText's train step for ``path`` (a MaxText config or model file) with
    ``overrides`` and tierax's flags (:func:`tierax.interop.maxtext_program.config.load`) for
    ``devices`` devices of ``target``; returns (result, scheduled HLO text; "" where XLA refused
    the program).

    The JAX backend must already run on the host platform only, with libtpu's environment for a
    TPU target (``tierax.launch.start_maxtext_compile``).
    """
    from tierax.interop.maxtext_program.config import load, parse_overrides
    from tierax.xla import hlo
    from tierax.xla.compile import without_persistent_cache
    from tierax.xla.oom import out_of_memory

    spec = hardware.get_target(target)
    user = parse_overrides(overrides)
    keys = target_keys(target, devices, user)
    tpu = spec.kind == "tpu"
    with load(
        path,
        [*overrides, *(f"{k}={v}" for k, v in keys.items() if k not in user)],
        mesh=mesh,
        microbatch=microbatch,
        seq=seq,
        grad_accum=grad_accum,
    ) as loaded:
        config = loaded.config
        topology = _mesh(config, target, devices, target_config)
        if topology.devices.size != devices:
            raise TieraxError(
                f"MaxText's mesh for this config holds {topology.devices.size} devices, not "
                f"{devices}; its ici_*/dcn_* parallelism must multiply to --devices"
            )
        t0 = time.perf_counter()
        refused = None
        try:
            with _maxtext_compile_options(), without_persistent_cache():
                compiled = _compiled(config, topology)
        except Exception as e:  # XLA raises a generic runtime error; only out-of-memory is a result
            refused = out_of_memory(e)
            if refused is None:
                raise
        compile_s = time.perf_counter() - t0
        limit = hardware.fit_limit_bytes(spec)
        common = dict(
            model=loaded.model,
            plan=f"remat_policy={config.remat_policy}",
            target=target,
            devices=devices,
            mesh=_tierax_axes(topology.shape),
            microbatch=loaded.microbatch,
            seq=loaded.seq,
            xla_preset="none",
            device_capacity_bytes=spec.device_memory_bytes,
            offloaded=(),
            compile_time_s=compile_s,
            attention=str(config.attention),
            quantization=str(config.quantization or ""),
            xla_environment=compile_environment(tpu),
        )
        notes = [f"MaxText's own train step ({_slice(config, target, devices)})"]
        if tpu is False and "attention" not in user:
            notes.append(
                f"attention={DEVICELESS_GPU_ATTENTION}: MaxText's autoselected GPU attention "
                "checks the device while tracing and cannot be compiled without a GPU"
            )
        if refused is not None:
            notes.append(f"XLA refused the program for device memory: {refused.message}")
            return (
                CompileResult(
                    **common,
                    fits=False,
                    device_peak_bytes=refused.required_bytes,
                    device_argument_bytes=None,
                    device_output_bytes=None,
                    device_alias_bytes=None,
                    device_temp_bytes=None,
                    host_temp_bytes=None,
                    overlap={},
                    notes=tuple(notes),
                    device_limit_bytes=refused.available_bytes or limit,
                    out_of_memory=True,
                    xla_error=refused.message,
                ),
                "",
            )
    mem = compiled.memory_analysis()
    text = compiled.as_text()
    module = hlo.parse_module(text)
    from tierax.costmodel import target_rates
    from tierax.hardware import cudnn
    from tierax.xla.compile import (
        host_transfers,
        libtpu_version,
        memory_figures,
        replay_notes,
        tpu_custom_calls,
    )

    arg, out, alias, temp = memory_figures(mem)
    peak = arg + out + temp - alias
    rates = target_rates(target, str(config.dtype))
    transfers = host_transfers(module, rates)
    notes += replay_notes(rates) if transfers else []

    calls = cudnn.custom_calls(text)
    workspace = 0
    if calls["backward"]:
        # One layer's backward runs at a time: one workspace, which a deviceless compile counts as
        # 0 (tierax's own compile adds it the same way).
        workspace = cudnn.backward_workspace_bytes(
            loaded.microbatch,
            max(1, int(config.num_query_heads) // loaded.mesh["tensor"]),
            loaded.seq,
            _qk_head_dim(config),
        )
        peak += workspace
        notes.append(
            f"cuDNN fused attention: {calls['forward']} forward and {calls['backward']} backward "
            f"custom calls; the peak includes {workspace / 2**20:.1f} MiB of backward workspace "
            "computed from shapes (4·B·H·S·(d_qk+1) + 256 bytes), which a deviceless compile "
            "counts as 0"
        )
    fits, note = judged_fit(peak, limit, libtpu_version() if tpu else None)
    if note:
        notes.append(note)
    return (
        CompileResult(
            **common,
            fits=fits,
            device_peak_bytes=peak,
            device_argument_bytes=arg,
            device_output_bytes=out,
            device_alias_bytes=alias,
            device_temp_bytes=temp,
            host_temp_bytes=int(mem.host_temp_size_in_bytes),
            overlap=hlo.overlap_summary(transfers),
            notes=tuple(notes),
            cudnn_calls=calls["forward"] + calls["backward"],
            cudnn_workspace_bytes=workspace,
            tpu_custom_calls=tpu_custom_calls(text) if tpu else 0,
            libtpu_version=libtpu_version() if tpu else "",
            device_limit_bytes=limit,
            host_argument_bytes=int(getattr(mem, "host_argument_size_in_bytes", 0) or 0),
        ),
        text,
    )


def compile_environment(tpu: bool, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The flags XLA compiled with, as the environment variable that carries them: for a TPU
    target ``LIBTPU_INIT_ARGS``, for a GPU ``XLA_FLAGS`` (less ``--xla_dump_to``, which changes
    where XLA writes, not the program); absent where unset."""
    env = os.environ if environ is None else environ
    if tpu:
        value = env.get("LIBTPU_INIT_ARGS", "").strip()
        return {"LIBTPU_INIT_ARGS": value} if value else {}
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_dump_to")]
    return {"XLA_FLAGS": " ".join(flags)} if flags else {}


def judged_fit(peak: int, limit: int, libtpu: str | None) -> tuple[bool, str | None]:
    """Whether a compiled MaxText step fits: its figures' peak within the device's limit — on a TPU
    too, where XLA:TPU may compile a program whose reported peak is above its HBM without an
    out-of-memory error (``libtpu``: its version; None for a GPU target), which is then not counted
    as fitting (``plan --maxtext --check`` judges its compiles the same way); and the note saying
    so (None where nothing is to be said)."""
    if peak <= limit:
        return True, None
    if libtpu is None:
        return False, None
    return False, (
        f"the compiled peak {peak / 2**30:.2f} GiB is over XLA:TPU's limit of "
        f"{limit / 2**30:.2f} GiB, yet libtpu {libtpu or '(unknown)'} compiled the program without "
        "an out-of-memory error: not counted as fitting (a compile cannot say that it runs)"
    )


def _tierax_axes(shape: Mapping[str, int]) -> dict[str, int]:
    """MaxText's compiled mesh (its axis → size) in tierax's axes: the batch-sharding axes MaxText
    adds to fsdp (fsdp_transpose) counted as fsdp; an axis tierax has no name for (context,
    sequence, stage) kept under its own name where it is not 1."""
    out = {
        "data": int(shape.get("data", 1)),
        "fsdp": int(shape.get("fsdp", 1)) * int(shape.get("fsdp_transpose", 1)),
        "tensor": int(shape.get("tensor", 1)),
        "expert": int(shape.get("expert", 1)),
    }
    known = {"data", "fsdp", "fsdp_transpose", "tensor", "expert"}
    return out | {a: int(n) for a, n in shape.items() if a not in known and int(n) != 1}


def _qk_head_dim(config) -> int:
    """The query/key head dim of MaxText's attention (MLA: its no-RoPE plus RoPE parts)."""
    if str(getattr(config, "attention_type", "")).lower().endswith("mla"):
        return int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)
    return int(config.head_dim)


def _slice(config, target: str, devices: int) -> str:
    if hardware.get_target(target).kind == "tpu":
        return f"deviceless XLA:TPU compile for MaxText's {config.compile_topology}"
    return f"deviceless XLA:GPU compile for {devices} {target}, MaxText's device mesh"

