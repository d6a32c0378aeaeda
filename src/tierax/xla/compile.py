"""Compile a plan's full train step for a GPU target on a machine without a GPU.

With the CUDA PJRT plugin installed (``pip install 'tierax[gpu-aot]'``) and
``jax_platforms=cpu``, ``jax.experimental.topologies.get_topology_desc`` gives
compile-only GPU devices for a GpuTargetConfigProto rendered from
:mod:`tierax.hardware`.  The train step (params, grads, AdamW state, activations)
is lowered with ShapeDtypeStructs sharded on those devices and compiled by the
real XLA GPU pipeline; XLA's memory analysis and scheduled HLO are then read.
Without autotuning, sizes are close to a real GPU's, not exact.  No cuDNN flash
attention is available without a device: the attention compiled is the model's
own XLA form (``attention: xla`` materialises the score matrices; ``blockwise``
does not), and the result says which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tierax import costmodel, hardware
from tierax import plan as plan_lib
from tierax.costmodel.terms import offload_host_bytes
from tierax.errors import TieraxError
from tierax.hardware import cudnn, libtpu
from tierax.hardware.device_kinds import target_key_for
from tierax.hardware.target_config import render_target_config, scheduling_target_config
from tierax.mesh import MeshShape
from tierax.models import abstract_model
from tierax.models.config import require_concrete_attention, require_quantization_runs
from tierax.models.prefetch import OFFLOAD_SCOPE_PREFIX
from tierax.sharding import rules as sh
from tierax.tracing import inventory as inv
from tierax.tracing.jaxpr_tools import GROUP_SCOPE_PREFIX
from tierax.train import masters
from tierax.train import step as step_lib
from tierax.xla import hlo
from tierax.xla import recompute as recompute_lib
from tierax.xla.oom import out_of_memory
from tierax.xla.result import CompileResult, OffloadedName, refused_result


def install_command() -> str:
    return (
        f'pip install "jax[cuda13-local]=={jax.__version__}" "nvidia-cuda-nvcc>=13,<14" '
        f'"nvidia-nvvm>=13,<14"'
        "   (or: pip install 'tierax[gpu-aot]')"
    )


def check_gpu_aot() -> None:
    """Raise a TieraxError with the exact install command if deviceless GPU compilation is
    unavailable."""
    import jaxlib

    problems = []
    if importlib.util.find_spec("jax_plugins.xla_cuda13") is None:
        problems.append(
            "the CUDA 13 PJRT plugin (jax-cuda13-plugin, jax-cuda13-pjrt) is not installed"
        )
    else:
        got = importlib.metadata.version("jax-cuda13-plugin")
        if got != jaxlib.__version__:
            problems.append(f"jax-cuda13-plugin {got} does not match jaxlib {jaxlib.__version__}")
    if (
        importlib.util.find_spec("nvidia.cu13") is None
        and importlib.util.find_spec("nvidia.cuda_nvcc") is None
    ):
        problems.append("ptxas/libdevice (nvidia-cuda-nvcc, nvidia-nvvm) are not installed")
    if problems:
        raise TieraxError(
            "deviceless GPU compilation needs the gpu-aot extra: "
            + "; ".join(problems)
            + ". Install with: "
            + install_command()
        )


def tpu_install_command() -> str:
    return f"pip install \"jax[tpu]=={jax.__version__}\"   (or: pip install 'tierax[tpu-aot]')"


def check_tpu_aot() -> None:
    """Raise a TieraxError with the install command if deviceless TPU compilation is unavailable (no
    libtpu)."""
    if importlib.util.find_spec("libtpu") is None:
        raise TieraxError(
            "deviceless TPU compilation needs libtpu (the tpu-aot extra, ~0.7 GB). Install with: "
            + tpu_install_command()
        )


def libtpu_version() -> str:
    """The installed libtpu's version ("" where it is not installed)."""
    return libtpu.installed_version()


def tpu_custom_calls(text: str) -> int:
    """How many ``tpu_custom_call`` instructions (Pallas/Mosaic kernels) an HLO text holds."""
    return len(re.findall(r'custom_call_target="tpu_custom_call"', text))


def tpu_topology(spec, devices: int):
    """Compile-only TPU devices for a slice of ``devices`` chips (``spec.topology_name`` picks the
    shape)."""
    from jax.experimental import topologies

    name = spec.topology_name(devices)
    # libtpu's default host is 2x2x1 chips; a single-chip slice needs its own host bounds.
    extra = {"chips_per_host_bounds": [1, 1, 1]} if devices == 1 else {}
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=name, **extra)
    except Exception as e:  # noqa: BLE001 - libtpu raises a generic error
        raise TieraxError(
            f"libtpu rejected topology {name!r} for {spec.key!r}: {str(e).strip().splitlines()[0]}"
        ) from None


def attached_tpu(spec, devices: int) -> list | None:
    """The attached TPU's first ``devices`` devices where JAX runs on TPUs of ``spec``'s kind, else
    None.  A compile for them is the program that runs here, with this machine's libtpu; a
    deviceless compile of the same step can differ from it (another libtpu, or the same one
    without the device's runtime)."""
    if spec.kind != "tpu" or jax.default_backend() != "tpu":
        return None
    local = jax.devices()
    if len(local) < devices or target_key_for("tpu", local[0].device_kind) != spec.key:
        return None
    return local[:devices]


@contextlib.contextmanager
def _capture_fd2():
    """Capture what native code writes to file descriptor 2 (XLA logs parse errors there)."""
    captured = {"text": ""}
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured["text"] = tmp.read().decode(errors="replace")


@contextlib.contextmanager
def without_persistent_cache():
    """No entry of JAX's persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``) written by a
    deviceless compile: a compile-only client can write one but not load it back ("PjRtCompiler
    must be constructed with a Client to call DeserializeLoadedExecutable"), so a second compile
    of the same step would warn and compile anyway (tests/test_compile.py compiles one twice under
    the suite's cache).  JAX decides once per process whether the cache is used, so turning it off
    here would not hold; a minimum compile time no compile reaches stops the write, and with no
    entry there is nothing to load."""
    key = "jax_persistent_cache_min_compile_time_secs"
    was = getattr(jax.config, key)
    jax.config.update(key, float("inf"))
    try:
        yield
    finally:
        jax.config.update(key, was)


def gpu_topology(target_config: str, devices: int, target: str):
    from jax.experimental import topologies

    with _capture_fd2() as log:
        try:
            return topologies.get_topology_desc(
                platform="cuda", target_config=target_config, topology=f"1x1x{devices}"
            )
        except Exception as e:  # XLA raises a generic error; the parser's reason went to the log
            failure = e
    reason = re.search(r"Error parsing text-format[^:]*: (.*)", log["text"])
    detail = reason.group(1).strip() if reason else str(failure).strip().splitlines()[0]
    at = re.match(r"(\d+):\d+:", detail)
    lines = target_config.splitlines()
    if at and 0 < int(at.group(1)) <= len(lines):
        detail += f" (line {at.group(1)}: {lines[int(at.group(1)) - 1].strip()!r})"
    raise TieraxError(
        f"jaxlib {jax.__version__} rejected the target config for {target!r}: {detail}. Give a "
        "GpuTargetConfigProto text file without that field (or with it fixed) as --target-config "
        "(see `tierax compile --help`)"
    )


def memory_figures(mem) -> tuple[int, int, int, int]:
    """(arguments, outputs, aliased, temp) bytes of a compile's ``memory_analysis()``."""
    return (
        int(mem.argument_size_in_bytes),
        int(mem.output_size_in_bytes),
        int(mem.alias_size_in_bytes),
        int(mem.temp_size_in_bytes),
    )


def host_transfers(module: hlo.Module, rates) -> list:
    """Every host transfer of a scheduled module with the static overlap check, at ``rates``' GEMM
    rate, HBM bandwidth and host link in each direction — the :class:`tierax.costmodel.Rates`
    `simulate` prices the target with (:func:`tierax.xla.hlo.host_transfers`) — and the splash
    attention kernel's calls at its fused attention rates (:mod:`tierax.xla.splash_calls`)."""
    from tierax.xla import splash_calls

    return hlo.host_transfers(
        module,
        peak_flops=rates.matmul_flops_per_s,
        hbm_bytes_per_s=rates.hbm_bytes_per_s,
        host_link_bps=rates.d2h_bytes_per_s,
        h2d_link_bps=rates.h2d_bytes_per_s,
        kernel_s=splash_calls.kernel_seconds(rates),
    )


def xla_recompute(module: hlo.Module, rates) -> dict:
    """XLA's rematerialization clones in a scheduled module, priced at the replay's rates (the
    ``xla_recompute`` summary of :mod:`tierax.xla.recompute`)."""
    from tierax.xla import splash_calls

    return recompute_lib.summary(
        recompute_lib.recomputed(
            module,
            peak_flops=rates.matmul_flops_per_s,
            hbm_bytes_per_s=rates.hbm_bytes_per_s,
            kernel_s=splash_calls.kernel_seconds(rates),
        )
    )


def replay_notes(rates) -> list[str]:
    """What the static overlap check replays the copies at: ``rates``' figures and their
    sources."""
    src = rates.sources
    return [
        f"copies replayed at the host link simulate prices with: "
        f"{rates.d2h_bytes_per_s / 1e9:.2f} GB/s device → host, "
        f"{rates.h2d_bytes_per_s / 1e9:.2f} GB/s host → device ({src.get('host_link', '')})",
        f"compute between them at {rates.matmul_flops_per_s / 1e12:.0f} TFLOP/s and "
        f"{rates.hbm_bytes_per_s / 1e12:.2f} TB/s (simulate's GEMM rate and HBM bandwidth)",
    ]


def abstract_train_state(cfg, optimizer, mesh: Mesh, plan: plan_lib.Plan | None = None):
    """(graphdef, TrainState of ShapeDtypeStructs sharded on ``mesh``); ``plan``: its offloaded
    moments' and master weights' shardings carry the ``pinned_host`` memory kind
    (:func:`tierax.plan.state_shardings`), the latter with their compute-dtype copies on the device
    (:mod:`tierax.train.masters`).
    """
    graphdef, params = nnx.split(abstract_model(cfg))
    p_shard = sh.param_shardings(params, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_opt = jax.eval_shape(optimizer.init, params)
    o_shard = optax.tree_map_params(
        optimizer, lambda _, s: s, abstract_opt, p_shard, transform_non_params=lambda _: replicated
    )
    compute = None
    if plan is not None and plan.offloads_state:
        o_shard = plan_lib.state_shardings(plan, o_shard, "moments")
        compute = masters.compute_shapes(plan, cfg, jax.tree.map(sds, params, p_shard))
        p_shard = plan_lib.state_shardings(plan, p_shard, "master_weights")

    state = step_lib.TrainState(
        jax.tree.map(sds, params, p_shard),
        jax.tree.map(sds, abstract_opt, o_shard),
        jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
        compute,
    )
    return graphdef, state


def sds(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


@dataclass(frozen=True)
class HostBuffer:
    """A host (S(5)) array that a forward layer loop writes: one offloaded name's stack over the
    loop's layers."""

    group: str  # plan group (a segment as group@A-B); "<unknown>" when XLA kept no group scope
    # from its store's or loads' op_name (models.prefetch.OFFLOAD_SCOPE_PREFIX); None: XLA kept none
    name: str | None
    nbytes: int


def _forward_host_buffers(module: hlo.Module) -> list[HostBuffer]:
    """The host buffers written by layer loops, each with its group and (where XLA kept it)
    activation name.

    For each ``while`` whose loop-carried tuple holds S(5) arrays, the body's root element for that
    array is followed to the store that writes it (a loop that only passes a buffer on reads it: the
    backward).  The group is the ``tierax_group_<name>`` scope in the loop's (or the store's)
    op_name.  The name is the ``tierax_offload_<name>`` scope (:mod:`tierax.models.prefetch`) of the
    store or of the loads that read the buffer: XLA's pipelined host offloading rewrites the stores
    without metadata but keeps the loads'.
    """
    comp_of = {i.name: c for c, instrs in module.computations.items() for i in instrs}
    loops: dict[str, list[hlo.Instruction]] = {}
    for instrs in module.computations.values():
        for ins in instrs:
            if ins.opcode == "while":
                loops.setdefault(ins.attr("body"), []).append(ins)
    named: dict[
        tuple[str, int], set[str]
    ] = {}  # (loop, index) → op_names of the named stores and loads on it
    for ins in module.by_name.values():
        scoped = ins.operands and OFFLOAD_SCOPE_PREFIX in hlo.op_name(ins)
        first = module.by_name.get(ins.operands[0]) if scoped else None
        if first is not None and first.arrays[:1] and first.arrays[0].host:
            for carried in hlo.loop_buffers(module, first, comp_of, loops):
                named.setdefault(carried, set()).add(hlo.op_name(ins))
    out = []
    for body, whiles in loops.items():
        root = module.by_name.get(module.roots.get(body, ""))
        for ins in whiles:
            if root is None or root.opcode != "tuple" or not any(a.host for a in ins.arrays):
                continue
            for k, a in enumerate(ins.arrays):
                value = (
                    module.by_name.get(root.operands[k])
                    if a.host and k < len(root.operands)
                    else None
                )
                if value is None or value.arrays[:1] != [
                    a
                ]:  # not this element (a tuple the reader misaligned)
                    continue
                store = hlo.store_of(module, value, OFFLOAD_SCOPE_PREFIX)
                if store is None:
                    continue
                where = " ".join(
                    [hlo.op_name(store), hlo.op_name(ins), *named.get((ins.name, k), ())]
                )
                g = re.search(GROUP_SCOPE_PREFIX + r"([\w\-]+)", where)
                # A segment's scope is group__A_B (models.decoder.segment_scope): its plan name is
                # group@A-B.
                group = re.sub(r"__(\d+)_(\d+)$", r"@\1-\2", g.group(1)) if g else "<unknown>"
                names = set(
                    re.findall(
                        OFFLOAD_SCOPE_PREFIX + r"(\w+)", " ".join(named.get((ins.name, k), ()))
                    )
                )
                # Stores and loads under different names (a tierax bug) give a name no activation
                # has: not found.
                name = "+".join(sorted(names)) or None
                out.append(HostBuffer(group, name, int(a.assigned_bytes)))
    return out


def _attribute(
    wanted: list[tuple[str, str, int]], buffers: list[HostBuffer], host_temp: int
) -> tuple[list[OffloadedName], list[str]]:
    """Each offloaded (group, name, expected bytes) → its host buffer: by the name XLA kept in its
    op_names, else (XLA kept none) by size within the group, said so in the notes; plus notes on
    mismatches and host bytes in no offloaded name's buffer."""
    pool, found, notes, by_size = list(buffers), [], [], []
    for group, name, expected in wanted:
        in_group = [b for b in pool if b.group == group] or [
            b for b in pool if b.group == "<unknown>"
        ]
        match = next((b for b in in_group if b.name == name), None)
        how = "op_name"
        if match is None:
            match = next((b for b in in_group if b.name is None and b.nbytes == expected), None)
            how = "size" if match else ""
        if match is not None:
            pool.remove(match)
        if how == "size":
            by_size.append((group, name, expected))
        elif match is not None and match.nbytes != expected:
            notes.append(
                f"{group}/{name}: XLA's host buffer holds {match.nbytes} bytes, the inventory "
                f"expects {expected} (mismatch)"
            )
        found.append(OffloadedName(group, name, expected, match.nbytes if match else 0, how))
    if by_size:
        same = sorted(
            {
                f"{g}/{n}"
                for g, n, e in by_size
                for g2, n2, e2 in by_size
                if (g, e) == (g2, e2) and n != n2
            }
        )
        notes.append(
            f"host buffers of {', '.join(f'{g}/{n}' for g, n, _ in by_size)} matched by size: "
            "XLA's program keeps no activation name for them (under mechanism: policy, JAX moves "
            "residuals with no name scope)"
            + (
                f"; {', '.join(same)} are equal in size, so which buffer is which is unknown"
                if same
                else ""
            )
        )
    attributed = sum(o.host_bytes for o in found)
    if attributed != host_temp:
        left = ", ".join(f"{b.group}/{b.name or '?'} {b.nbytes}" for b in pool) or "none"
        notes.append(
            f"{host_temp - attributed} bytes of XLA's host temp ({host_temp}) are in no offloaded "
            f"name's buffer (unattributed; unmatched host buffers in layer loops: {left})"
        )
    return found, notes


def compile_for_target(
    cfg,
    plan: plan_lib.Plan,
    target: str,
    *,
    microbatch: int,
    seq: int,
    mesh: MeshShape | None = None,
    xla_preset: str = "none",
    target_config: str | None = None,
    grad_accum: int = 1,
    on_compiled: Callable[[Any], None] | None = None,
    calibration=None,
) -> tuple[CompileResult, str]:
    """Compile the train step of ``cfg`` under ``plan`` for ``target``; returns (result, scheduled
    HLO text).

    ``microbatch`` is sequences per device; the global batch is ``microbatch × mesh.batch_ways``
    (``mesh`` default: one device), ``grad_accum`` microbatches of it per optimizer update.
    ``xla_preset`` is recorded only: the flags must already be set (tierax.launch.flags.configure).
    ``on_compiled`` is called with JAX's compiled executable before it is read (e.g. for XLA's
    ``cost_analysis()``); not called when XLA refuses the program.
    """
    require_concrete_attention(cfg, "compile")
    require_quantization_runs(cfg, target)  # mxfp8 on a target without MXFP8 GEMMs: refused
    spec = hardware.get_target(target)
    tpu = spec.kind == "tpu"
    shape = mesh or MeshShape()
    devices = shape.size
    attached = None  # the attached TPU's devices the program is compiled for (attached_tpu)
    fused = cfg.attention == "cudnn"
    if fused and tpu:
        raise TieraxError(
            f"attention=cudnn is cuDNN's fused attention, which runs on CUDA GPUs only; for the "
            f"TPU target {target!r} use attention=splash (the Pallas TPU kernel) or "
            "attention=blockwise (e.g. --set attention=splash)"
        )
    if not tpu:
        from tierax.models.moe import require_moe_runs

        require_moe_runs(cfg, target, "gpu")
    if cfg.attention == "splash" and not tpu:
        raise TieraxError(
            f"attention=splash is the Pallas TPU kernel, which compiles for TPUs only; for the GPU "
            f"target {target!r} use attention=cudnn or blockwise (e.g. --set attention=cudnn)"
        )
    if cfg.attention == "splash":
        from tierax.models.attention import splash_block

        splash_block(seq)  # a sequence the kernel cannot tile is refused before compiling
    if tpu:
        check_tpu_aot()
        if target_config is not None:
            raise TieraxError("--target-config is a GpuTargetConfigProto; a TPU target takes none")
        attached = attached_tpu(spec, devices)
        topo_devices = attached or tpu_topology(spec, devices).devices
    else:
        plan_lib.check_mechanism_preset(plan, xla_preset, "compile")
        check_gpu_aot()
        # The target states the cuDNN that JAX's CUDA plugin loads here (9.10 when none is
        # installed).
        dnn = cudnn.require() if fused else (cudnn.installed_version() or (9, 10, 0))
        # The scheduler's memory budget as on the real device (see
        # target_config.scheduling_target_config).
        text = scheduling_target_config(target_config or render_target_config(spec, cudnn=dnn))
        topo_devices = gpu_topology(text, devices, target).devices
    mesh = shape.make(topo_devices)
    optimizer = step_lib.make_optimizer(mu_dtype=cfg.mu_dtype)
    graphdef, state = abstract_train_state(cfg, optimizer, mesh, plan)
    global_batch = microbatch * shape.batch_ways
    if grad_accum > 1:  # [microbatches, batch, seq + 1], the batch over the batch axes
        tokens = jax.ShapeDtypeStruct(
            (grad_accum, global_batch, seq + 1),
            jnp.int32,
            sharding=NamedSharding(mesh, PartitionSpec(None, *sh.batch_sharding(mesh).spec)),
        )
    else:
        tokens = jax.ShapeDtypeStruct(
            (global_batch, seq + 1), jnp.int32, sharding=sh.batch_sharding(mesh)
        )
    step = step_lib.make_train_step(
        graphdef,
        cfg,
        plan,
        optimizer,
        jax.tree.map(lambda x: x.sharding, state),
        grad_accum=grad_accum,
    )

    # The plan's host bytes against the target's host memory, before XLA spends any time on it.
    full_inventory = inv.model_inventory(cfg, microbatch, seq, shape.to_dict())
    # The rates simulate prices the target with (--rates applied): the prediction's and the
    # static overlap check's
    rates = costmodel.target_rates(target, cfg.dtype)
    if calibration is not None:
        rates = calibration.apply(rates)
    predicted = _prediction(
        cfg, plan, full_inventory, rates, xla_preset, grad_accum, calibrated=calibration is not None
    )
    host_memory = int(spec.host_memory_per_gpu_bytes)
    if predicted["host_bytes"] > host_memory:
        raise TieraxError(
            f"plan {plan.name!r} puts {predicted['host_bytes'] / 2**30:.2f} GiB per device in host "
            f"memory (training state {predicted['state_host_bytes'] / 2**30:.2f} GiB), more than "
            f"{target}'s {host_memory / 2**30:.2f} GiB per device; keep more of it on device or "
            "recompute it (tierax plan chooses within the host budget)"
        )
    t0 = time.perf_counter()
    capability = (
        contextlib.nullcontext() if tpu else cudnn.target_capability(spec.compute_capability)
    )
    try:
        with capability, without_persistent_cache():
            compiled = step.trace(state, tokens).lower().compile()
    # XLA raises a generic runtime error; only an out-of-memory one is a result
    except Exception as e:
        refused = out_of_memory(e)
        if refused is None:
            raise
        compiled = None
    compile_s = time.perf_counter() - t0
    placements = plan_lib.resolve(plan, cfg)
    limit = hardware.fit_limit_bytes(spec)
    if compiled is None:
        refused_at = refused_result(
            refused,
            cfg=cfg,
            plan=plan,
            target=target,
            devices=devices,
            shape=shape,
            microbatch=microbatch,
            seq=seq,
            xla_preset=xla_preset,
            spec=spec,
            limit=limit,
            compile_s=compile_s,
            predicted=predicted,
        )
        return dataclasses.replace(refused_at, libtpu_version=libtpu_version() if tpu else ""), ""
    if on_compiled is not None:
        on_compiled(compiled)
    mem = compiled.memory_analysis()
    text = compiled.as_text()
    module = hlo.parse_module(text)

    arg, out, alias, temp = memory_figures(mem)
    # Every libtpu compiled with here keeps the host temp outside temp_size_in_bytes: XLA:TPU's
    # buffer assignment puts it in its own color-5 heap, and temp_size_in_bytes less the HBM heap
    # is smaller than it in each compile read (bench/results/libtpu_colors_tr1.json; 0.0.52's
    # temp equals its HBM heap, bench/results/libtpu_trace_0.0.52.json).
    host_temp = int(mem.host_temp_size_in_bytes)
    peak = arg + out + temp - alias
    calls = cudnn.custom_calls(text)
    workspace = 0
    if calls["backward"]:
        # One layer's backward runs at a time: one workspace, which this compile counts as 0.
        _, dqk, _ = cfg.attention_dims()
        workspace = cudnn.backward_workspace_bytes(
            microbatch, cfg.num_heads // shape.tensor, seq, dqk
        )
        peak += workspace

    gemms8 = hlo.fp8_gemms(module)
    inventory = inv.for_plan(full_inventory, plan, cfg)
    wanted = [
        (
            a.group,
            a.name,
            offload_host_bytes(
                a.group, a.name, a.host_stack_bytes_per_layer, a.num_layers, plan.mechanism
            ),
        )
        for a in inventory.activations()
        if placements.get(a.group, {}).get(a.name) is plan_lib.Placement.OFFLOAD
    ]
    # The plan's offloaded training state: pinned_host arguments (and outputs) of the step, whose
    # streamed update's host stacks XLA counts in its host temp, where host buffers of different
    # times share memory (the activations' are dead by the update).
    state_host = int(predicted.get("state_host_bytes", 0))
    host_args = int(getattr(mem, "host_argument_size_in_bytes", 0) or 0)
    offloaded, host_notes = _attribute(wanted, _forward_host_buffers(module), host_temp)
    if state_host:
        acts = sum(o.host_bytes for o in offloaded)
        host_notes = [n for n in host_notes if "unattributed" not in n]
        host_notes.append(
            f"training state offloaded by the plan: {state_host} bytes; XLA's host arguments "
            f"{host_args} bytes ({(host_args - state_host) / state_host:+.2%}); its host temp "
            f"{host_temp} bytes beside the larger of the state and the offloaded activations' "
            f"{acts} bytes (host buffers of the backward and the update share memory)"
        )
    transfers = host_transfers(module, rates)
    notes = replay_notes(rates) + host_notes
    overlap = hlo.overlap_summary(transfers)
    recomputed = xla_recompute(module, rates)
    predicted["compiled_step_s"] = recompute_lib.compiled_step_s(
        predicted["model_step_s"],
        recomputed["est_s"],
        overlap["by_direction"]["h2d"]["est_exposed_s"] - predicted["model_load_exposed_s"],
    )
    if recomputed["instructions"]:
        notes.append(
            f"XLA's rematerialization pass recomputes {recomputed['instructions']} instruction(s) "
            f"the plan does not (~{recomputed['est_s'] * 1e3:.1f} ms a step at these rates): the "
            "program's live values reached the compiler's memory limit, so it holds less and "
            "computes more than the plan says"
        )
    if not tpu:
        notes.append(
            "XLA scheduled within the run's device budget (capacity less the runtime reserve, as "
            "JAX's allocator gives it on the device), not the 80 % a deviceless compile assumes by "
            "default"
        )
    if calls["forward"] or calls["backward"]:
        notes.append(
            f"cuDNN flash attention: {calls['forward']} forward and {calls['backward']} backward "
            f"custom calls; the peak includes {workspace / 2**20:.1f} MiB of backward workspace "
            "computed from shapes (4·B·H·S·(d_qk+1) + 256 bytes), which a deviceless compile "
            "counts as 0"
        )
    elif fused:
        notes.append("attention=cudnn, but XLA's program holds no cuDNN attention call")
    if cfg.quantization == "fp8":
        n8 = gemms8["cublaslt"] + gemms8["dot"]
        notes.append(
            f"quantization=fp8: {n8} fp8 GEMMs in XLA's program as written (a scanned layer's "
            f"once): {gemms8['cublaslt']} cuBLASLt fp8 calls, {gemms8['dot']} dots of fp8 "
            "operands (Triton GEMM fusions in a deviceless compile, which does not autotune)"
            if n8
            else "quantization=fp8, but XLA's program holds no fp8 GEMM"
        )
    if cfg.quantization == "mxfp8":
        nb, left = gemms8["block_scaled"], gemms8["block_scaled_unrewritten"]
        notes.append(
            f"quantization=mxfp8: {nb} cuDNN block-scaled MXFP8 GEMM calls "
            "(__cudnn$blockScaledDot) in XLA's program as written (a scanned layer's once)"
            + (f"; {left} __op$block_scaled_dot calls XLA did not rewrite" if left else "")
            if nb or left
            else "quantization=mxfp8, but XLA's program holds no block-scaled GEMM"
        )
    tpu_calls = tpu_custom_calls(text) if tpu else 0
    if cfg.attention == "splash":
        notes.append(
            f"splash attention: {tpu_calls} tpu_custom_call instructions (Pallas kernels) in XLA's "
            "program; their scratch is inside the compile's temp"
            if tpu_calls
            else "attention=splash, but XLA's program holds no tpu_custom_call"
        )
    # XLA:TPU assigns every buffer at compile time and refuses a program whose assignment exceeds
    # its HBM limit (the out-of-memory result above), so a TPU program it compiled fits, whatever
    # memory_analysis() reports: libtpu 0.0.42.1's temp_size_in_bytes exceeds its own buffer
    # assignment (tierax.hardware.libtpu; tests/test_tpu_kept_layout.py compiles one such step).
    fits = peak <= limit or tpu
    if tpu and peak > limit:
        notes.append(
            f"memory_analysis() reports {peak / 2**30:.2f} GiB, over XLA:TPU's limit of "
            f"{limit / 2**30:.2f} GiB, yet XLA:TPU assigned the program's buffers within the limit "
            f"(it refuses a program otherwise): libtpu {libtpu_version() or '(none)'}'s "
            "temp_size_in_bytes exceeds its buffer assignment; the step fits"
        )
    if tpu:
        notes.insert(
            0,
            (
                f"XLA:TPU compile on the attached {attached[0].device_kind} × {devices} (the "
                "program that runs here)"
                if attached
                else f"deviceless XLA:TPU compile for {spec.topology_name(devices)}"
            )
            + f" (libtpu {libtpu_version() or '(none)'}); the static "
            "overlap check replays XLA:TPU's schedule of the host copies: on the v5e chip its "
            "loads' exposure agreed with the chip's waits, while it over-prices stores the chip "
            "hid (bench/investigations/replayed_exposure.py)",
        )
    result = CompileResult(
        model=cfg.name,
        plan=plan.name,
        target=target,
        devices=devices,
        mesh=shape.to_dict(),
        microbatch=microbatch,
        seq=seq,
        xla_preset=xla_preset,
        fits=fits,
        device_peak_bytes=peak,
        device_capacity_bytes=spec.device_memory_bytes,
        device_argument_bytes=arg,
        device_output_bytes=out,
        device_alias_bytes=alias,
        device_temp_bytes=temp,
        host_temp_bytes=host_temp,
        offloaded=tuple(offloaded),
        overlap=overlap,
        xla_recompute=recomputed,
        compiled_on=attached[0].device_kind if attached else "",
        peak_over_reported=bool(tpu and peak > limit),
        compile_time_s=compile_s,
        attention=cfg.attention,
        notes=tuple(notes),
        cudnn_calls=calls["forward"] + calls["backward"],
        cudnn_workspace_bytes=workspace,
        fp8_gemms=gemms8["cublaslt"] + gemms8["dot"] + gemms8["block_scaled"],
        block_scaled_gemms=gemms8["block_scaled"],
        quantization=cfg.quantization,
        tpu_custom_calls=tpu_calls,
        libtpu_version=libtpu_version() if tpu else "",
        device_limit_bytes=limit,
        predicted=predicted,
        host_argument_bytes=host_args,
        state_host_bytes=state_host,
    )
    return result, text


def _prediction(
    cfg,
    plan: plan_lib.Plan,
    inventory,
    rates,
    xla_preset: str,
    grad_accum: int = 1,
    calibrated: bool = False,
) -> dict:
    """The cost model's figures for the plan compiled at ``rates``: the schedule of its XLA preset
    (plan --check's); where ``calibrated`` (``rates`` carry a ``--rates`` calibration's factors)
    also the step time at its factors, and which factors those are."""
    schedule = "lhs-pipelined" if xla_preset == "lhs-pipelined" else "lhs"
    from tierax.tracing.model_program import for_inventory

    p = costmodel.simulate(plan, for_inventory(cfg, inventory), rates, schedule, grad_accum)
    return {
        "peak_device_bytes": p.peak_device_bytes,
        "host_bytes": p.host_bytes,
        "fits": p.fits,
        "schedule": schedule,
        "peak_phase": p.breakdown.peak_phase,
        "state_host_bytes": p.breakdown.state.host_bytes,
        "model_step_s": p.step_time_s,
        "model_load_exposed_s": p.breakdown.exposed_loads_s,
    } | (
        {"step_time_s": p.step_time_s, "calibration": rates.sources["calibration"]}
        if calibrated
        else {}
    )


def param_and_optimizer_bytes(cfg) -> int:
    """Global bytes of parameters plus AdamW moments (inv.moment_bytes_per_param)."""
    itemsize = jnp.dtype(cfg.param_dtype).itemsize
    return cfg.param_count() * (itemsize + inv.moment_bytes_per_param(cfg))
