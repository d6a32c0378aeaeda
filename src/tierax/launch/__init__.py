"""Process and backend start-up: XLA flags, devices, multi-process init, runtime environment.

Everything here runs before JAX starts its backend; every verb that runs,
compiles or measures a step starts through this module.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from tierax.errors import TieraxError
from tierax.launch import flags as xla_flags


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise TieraxError(msg)


def start(
    *,
    devices: int | None = None,
    preset: str = "none",
    deviceless_gpu: bool = False,
    dump_dir: str | None = None,
    run_step: bool = False,
    mesh_devices: int | None = None,
) -> None:
    """Start a single-process run: ``devices`` host CPU devices (CPU backend, as the user asked), an
    XLA flag preset, or deviceless XLA:GPU compilation (host platform only); ``dump_dir``: XLA's
    dumps go there.

    ``run_step``: the verb runs a step on the local devices, so the accelerator JAX finds (a TPU or
    a GPU) is used where the machine has one and neither ``devices`` nor JAX_PLATFORMS says
    otherwise (:func:`tierax.launch.flags.choose_platforms`).  ``mesh_devices``: the devices a
    ``--mesh`` needs, made as host CPU devices where the run lands on the CPU.

    Raises:
      TieraxError: bad preset or device count, or JAX already started.
    """
    on_accelerator = run_step and devices is None and uses_accelerator()
    xla_flags.configure(
        cpu_devices=devices if devices is not None or on_accelerator else mesh_devices,
        preset=preset,
        deviceless_gpu=deviceless_gpu,
        dump_dir=dump_dir,
        run_step=run_step,
    )


def uses_accelerator(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a verb that runs a step (and was not asked for host devices) lands on an
    accelerator: JAX_PLATFORMS names one, or is unset on a machine that has a TPU or a GPU."""
    env = os.environ if environ is None else environ
    chosen = env.get("JAX_PLATFORMS", "")
    if chosen:
        return any(p in chosen for p in ("tpu", "cuda", "gpu", "rocm"))
    return xla_flags.Accelerators.present().any


def describe_backend() -> str:
    """One line naming where this process runs: the platform, the device kind and the count (the
    first line a measuring verb prints)."""
    import jax

    devs = jax.devices()
    kind = devs[0].device_kind
    return f"running on {jax.default_backend()}: {len(devs)} × {kind}"


def start_deviceless_tpu(preset: str = "none", accelerator_type: str | None = None) -> None:
    """Start JAX for a deviceless TPU compile: the host platform only, so libtpu never claims a TPU
    backend.

    XLA presets are XLA:GPU flags, so only ``none`` is accepted.  Unless set:
    ``TPU_WORKER_HOSTNAMES=localhost`` keeps libtpu from looking for other TPU hosts when it builds
    the topology, and ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` lets two compiles run at once (libtpu
    otherwise holds /tmp/libtpu_lockfile and a second process fails with "Internal error when
    accessing libtpu multi-process lockfile").  ``accelerator_type`` (e.g. ``v5litepod-4``) becomes
    ``TPU_ACCELERATOR_TYPE``:
    libtpu otherwise warns on every compile that it cannot find it (the topology is named
    explicitly).  libtpu gets :data:`tierax.launch.flags.TPU_FLAGS` (the step's own TPU options).
    """
    if preset != "none":
        raise TieraxError(
            f"--xla-preset {preset!r} sets XLA:GPU flags; a TPU target takes --xla-preset none"
        )
    wanted = {
        "TPU_WORKER_HOSTNAMES": "localhost",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        **({"TPU_ACCELERATOR_TYPE": accelerator_type} if accelerator_type else {}),
    }
    env = {k: v for k, v in wanted.items() if not os.environ.get(k)}
    xla_flags.configure(platforms="cpu", env={**env, **xla_flags.libtpu_env()})


def start_tpu_compile(preset: str = "none", accelerator_type: str | None = None) -> bool:
    """Start JAX for a compile of tierax's step for a TPU target; returns whether the attached TPU
    is used.

    On a machine with a TPU (JAX_PLATFORMS unset) JAX starts its TPU backend, so that a target of
    the attached chip's kind compiles for the chip itself — the program that runs here, with this
    machine's libtpu (:func:`tierax.xla.compile.attached_tpu`); libtpu gets
    :data:`tierax.launch.flags.TPU_FLAGS` as a run's does.  Elsewhere, or where JAX_PLATFORMS
    chooses (``JAX_PLATFORMS=cpu``: deviceless even beside a chip), the deviceless start of
    :func:`start_deviceless_tpu`."""
    if not xla_flags.compiles_on_attached_tpu(
        env_platforms=os.environ.get("JAX_PLATFORMS", ""),
        found=xla_flags.Accelerators.present(),
    ):
        start_deviceless_tpu(preset, accelerator_type)
        return False
    if preset != "none":
        raise TieraxError(
            f"--xla-preset {preset!r} sets XLA:GPU flags; a TPU target takes --xla-preset none"
        )
    xla_flags.configure(run_step=True, env=xla_flags.libtpu_env())
    return True


def start_maxtext_compile(
    target: str, devices: int, run_env: Mapping[str, str] | None = None
) -> None:
    """Start JAX for a deviceless compile of MaxText's own train step
    (:mod:`tierax.xla.maxtext_step`): the host platform only; for a TPU target
    libtpu's environment as :func:`start_deviceless_tpu` sets it, but with the libtpu options
    MaxText's own ahead-of-time compiler adds (tierax's step options are for tierax's step); for a
    GPU target the deviceless GPU flags.  ``run_env``: the environment a MaxText run of a plan sets
    (:func:`tierax.interop.maxtext.runtime_env`), so the compile is the run's: its
    ``LIBTPU_INIT_ARGS`` after MaxText's own (as MaxText's train_compile appends its own to the
    environment's), its ``XLA_FLAGS`` for a GPU."""
    from tierax import hardware

    spec = hardware.compile_target(target)
    run_env = run_env or {}
    if spec.kind != "tpu":
        given = run_env.get("XLA_FLAGS", "")
        env = {"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {given}".strip()} if given else {}
        xla_flags.configure(deviceless_gpu=True, env=env)
        return
    wanted = {
        "TPU_WORKER_HOSTNAMES": "localhost",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        "TPU_ACCELERATOR_TYPE": spec.accelerator_type(devices),
    }
    env = {k: v for k, v in wanted.items() if not os.environ.get(k)}
    flags = (*xla_flags.MAXTEXT_TPU_FLAGS, *run_env.get(xla_flags.LIBTPU_ARGS, "").split())
    xla_flags.configure(platforms="cpu", env={**env, **xla_flags.libtpu_env_with(flags)})


def start_training(cfg, dist: Distributed | None, *, debug: bool = False) -> list[str]:
    """Start the backend for ``tierax train``: runtime environment derived from the plan,
    host CPU devices per process, cross-process collectives, then ``jax.distributed``;
    without ``debug``, Orbax's per-thread error tracebacks are kept off stderr.

    Returns the lines that say what was set.
    """
    if not debug:
        quiet_checkpoint_errors()
    nproc = dist.num_processes if dist else 1
    gpu = xla_flags.expects_gpu()
    accelerator = uses_accelerator()
    env, lines = runtime_env(cfg, gpu=gpu, num_processes=nproc)
    if not gpu:  # a TPU runs the step with its TPU options (read only where libtpu loads)
        env = {**env, **xla_flags.libtpu_env()}
    xla_flags.configure(
        cpu_devices=None if accelerator else cpu_devices_per_process(cfg, nproc),
        preset=cfg.xla_preset,
        cpu_collectives="gloo" if dist and not accelerator else None,
        env=env,
        run_step=True,
    )
    initialize_distributed(dist)
    return lines


@dataclass(frozen=True)
class Distributed:
    """How this process joins a multi-process run (``jax.distributed``).

    Attributes:
      coordinator: ``host:port`` of process 0's coordination service.
      num_processes: processes in the run.
      process_id: this process, 0-based.
    """

    coordinator: str
    num_processes: int
    process_id: int

    ENV = ("TIERAX_COORDINATOR", "TIERAX_NUM_PROCESSES", "TIERAX_PROCESS_ID")

    @classmethod
    def resolve(
        cls,
        coordinator: str | None,
        num_processes: int | None,
        process_id: int | None,
        environ: Mapping[str, str] | None = None,
    ) -> Distributed | None:
        """From flags, else the ``TIERAX_*`` environment; None for a single-process run.

        Raises:
          TieraxError: only some of the three are given, or they are inconsistent.
        """
        env = os.environ if environ is None else environ
        given = [coordinator, num_processes, process_id]
        names = ["--coordinator", "--num-processes", "--process-id"]
        for i, var in enumerate(cls.ENV):
            if given[i] is None and env.get(var):
                given[i] = env[var]
                names[i] = var
        if all(g is None for g in given):
            return None
        missing = [
            f"{n} (or {v})" for g, n, v in zip(given, names, cls.ENV, strict=True) if g is None
        ]
        if missing:
            raise TieraxError(
                f"a multi-process run needs all of coordinator, process count and process id; "
                f"missing: {', '.join(missing)}"
            )
        try:
            n, i = int(given[1]), int(given[2])
        except ValueError:
            raise TieraxError(
                f"{names[1]} and {names[2]} must be integers, got {given[1]!r} and {given[2]!r}"
            ) from None
        coord = str(given[0])
        _check(
            ":" in coord and coord.rsplit(":", 1)[1].isdigit(),
            f"{names[0]}={coord!r}: expected HOST:PORT of process 0, e.g. 10.0.0.1:1234",
        )
        _check(n >= 1, f"{names[1]} must be ≥ 1, got {n}")
        _check(0 <= i < n, f"{names[2]}={i} must be in 0..{n - 1} for {n} processes")
        return cls(coord, n, i)


def cpu_devices_per_process(cfg, num_processes: int = 1) -> int:
    """Host CPU devices each process creates: ``cpu_devices``, else the mesh size over the
    processes.

    Raises:
      TieraxError: the mesh does not split evenly over processes, or ``cpu_devices``
        contradicts the mesh.
    """
    size = cfg.mesh.size
    if cfg.cpu_devices is not None:
        _check(
            cfg.cpu_devices * num_processes == size,
            f"{cfg.source}: mesh {cfg.mesh} = {size} devices, but cpu_devices={cfg.cpu_devices} × "
            f"{num_processes} process(es) = {cfg.cpu_devices * num_processes}; make them equal "
            "(or leave cpu_devices unset)",
        )
        return cfg.cpu_devices
    _check(
        size % num_processes == 0,
        f"{cfg.source}: mesh {cfg.mesh} = {size} devices does not split over {num_processes} "
        f"processes; use a multiple of {num_processes}",
    )
    return size // num_processes


def initialize_distributed(dist: Distributed | None) -> None:
    """Join a multi-process run with JAX's own runtime; call after ``xla_flags.configure``,
    before any JAX operation.  Single-process runs (``None``) do nothing."""
    if dist is None:
        return
    import jax

    jax.distributed.initialize(
        coordinator_address=dist.coordinator,
        num_processes=dist.num_processes,
        process_id=dist.process_id,
    )


MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
HOST_LIMIT = "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"


def runtime_env(
    cfg, *, gpu: bool, num_processes: int = 1, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """GPU runtime variables derived from the run: (variables to set, lines to print).

    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` = ``runtime.device_budget_gb`` over the
    target's device memory (JAX preallocates 75 % by default, so a plan that fits
    90 % needs it); ``XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB`` = ``runtime.host_budget_gb``,
    else the plan's offloaded activation bytes on this process's devices plus 25 %.
    A variable already in the environment is kept.  On CPU neither applies.
    """
    if not gpu:
        return {}, [
            f"runtime env: {MEM_FRACTION} and {HOST_LIMIT} apply to GPUs only; nothing set "
            "off a GPU"
        ]
    from tierax import hardware
    from tierax.tracing import inventory as inv

    env = os.environ if environ is None else environ
    rt, wanted, lines = cfg.runtime, {}, []
    if rt.device_budget_gb is not None:
        hbm = hardware.get_target(rt.target).device_memory_bytes
        frac = min(0.95, rt.device_budget_gb * 1e9 / hbm)
        wanted[MEM_FRACTION] = (
            f"{frac:.2f}",
            f"device budget {rt.device_budget_gb:g} GB of {hbm / 1e9:.0f} GB ({rt.target})",
        )
    else:
        lines.append(
            f"runtime env: {MEM_FRACTION} not derived (no runtime.device_budget_gb); JAX "
            f"preallocates 75 %"
        )
    local_devices = max(1, cfg.mesh.size // num_processes)
    if rt.host_budget_gb is not None:
        wanted[HOST_LIMIT] = (f"{math.ceil(rt.host_budget_gb)}", "runtime.host_budget_gb")
    else:
        offload = inv.bytes_by_placement(
            inv.model_inventory(cfg.model, cfg.microbatch, cfg.seq, cfg.mesh.to_dict()),
            cfg.plan,
            cfg.model,
        )["offload"]
        if offload:
            gb = max(1, math.ceil(offload * local_devices * 1.25 / 1e9))
            wanted[HOST_LIMIT] = (
                str(gb),
                f"plan offloads {offload / 1e9:.2f} GB/device × {local_devices} devices + 25 %",
            )
        else:
            lines.append(
                f"runtime env: {HOST_LIMIT} not set (plan {cfg.plan.name} offloads nothing)"
            )
    out = {}
    for var, (value, why) in wanted.items():
        if var in env:
            lines.append(
                f"runtime env: kept {var}={env[var]} from the environment (derived: {value}, {why})"
            )
        else:
            out[var] = value
            lines.append(f"runtime env: set {var}={value} ({why})")
    return out, lines


# Attention implementations by the backend that runs them (tierax.models.attention).
LOCAL_ATTENTION = {
    "gpu": ("xla", "blockwise", "cudnn", "cudnn_blockwise", "splash_blockwise"),
    "cpu": ("xla", "blockwise", "cudnn_blockwise", "splash_blockwise"),
    "tpu": ("xla", "blockwise", "cudnn_blockwise", "splash", "splash_blockwise"),
}
# Where each fused kernel runs, and a compile that builds it without that device.
_FUSED_WHERE = {
    "cudnn": ("cuDNN's fused attention", "CUDA GPUs", "tierax compile --target h200"),
    "splash": ("the Pallas splash-attention kernel", "TPUs", "tierax compile --target v5p"),
}


def local_attention(
    cfg, *, what: str = "this run", documents: bool = False, set_example: str = "--set attention="
):
    """``cfg`` with its attention chosen for the local backend (``auto``: cuDNN's fused attention
    on a CUDA GPU, splash attention on a TPU, blockwise elsewhere or where ``documents`` are masked
    on a GPU), refused before tracing when the local backend cannot run it (cuDNN's fused attention
    off a CUDA GPU, splash attention off a TPU).

    ``set_example``: how the caller sets the attention, for the message (a train config's
    ``model.attention=``).

    Raises:
      TieraxError: naming the backend and the implementations that run there.
    """
    import jax

    from tierax.models.config import for_platform

    backend = jax.default_backend()
    platform = backend if backend in LOCAL_ATTENTION else "cpu"  # others run what a CPU runs
    cfg = for_platform(cfg, platform, documents=documents)
    ok = LOCAL_ATTENTION.get(backend, LOCAL_ATTENTION["cpu"])
    if cfg.attention not in ok:
        kernel, where, compile_cmd = _FUSED_WHERE[cfg.attention]
        raise TieraxError(
            f"{what}: attention={cfg.attention} runs {kernel} on {where} only; "
            f"this run's backend is {backend}, where {', '.join(ok)} run (e.g. {set_example}"
            f"blockwise; `{compile_cmd}` compiles {cfg.attention} without one)"
        )
    return cfg


def check_local_memory(cfg, *, shards: int = 1, copies: int = 4, what: str = "this run") -> None:
    """Refuse, before allocating, a model whose training state cannot fit the local devices.

    ``copies`` parameter-sized buffers (parameters, gradients, two AdamW moments) in
    ``param_dtype``, split over ``shards`` devices, against one device's memory (the
    allocator's limit on a GPU, physical RAM on the CPU backend, where all host
    devices share it).

    Raises:
      TieraxError: naming the bytes needed and available.
    """
    import jax
    import numpy as np

    need = cfg.param_count() * np.dtype(cfg.param_dtype).itemsize * copies
    dev = jax.devices()[0]
    stats = dev.memory_stats() if dev.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        have, where, need = stats["bytes_limit"], f"one {dev.device_kind}", need / shards
    else:
        have, where = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's RAM"
    if need > have:
        raise TieraxError(
            f"{cfg.name} has {cfg.param_count():,} parameters: its training state needs ≈ "
            f"{need / 2**30:,.1f} GiB, more than {where} ({have / 2**30:,.1f} GiB) for {what}; use "
            "a smaller model (--set) or plan it without running it (`tierax simulate` / `tierax "
            "compile`)"
        )


class _DropOrbaxErrors:
    """A logging filter: Orbax's background threads log every failed write with a traceback
    (hundreds of
    lines when the disk is full); tierax reports the failure itself, naming the last good
    checkpoint."""

    def filter(self, record) -> bool:
        return not ("orbax" in record.pathname and record.levelno >= 40)


def quiet_checkpoint_errors() -> None:
    """Keep Orbax's per-thread error tracebacks off stderr (``tierax --debug train`` shows them).

    Two sources: Orbax's logged errors, and "Event loop is closed" errors that native callbacks of
    an abandoned asynchronous save print through ``sys.excepthook`` after the save failed.
    """
    import contextlib
    import logging
    import sys

    # absl's own "absl" logger must exist before the filter is added to it (the models no longer
    # import Flax, and with it absl, when their package is imported)
    with contextlib.suppress(ImportError):
        import absl.logging  # noqa: F401

    for name in ("absl", "orbax"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropOrbaxErrors) for f in logger.filters):
            logger.addFilter(_DropOrbaxErrors())
    previous = sys.excepthook
    if getattr(previous, "_tierax_quiet", False):
        return

    def hook(kind, value, tb):
        if kind is RuntimeError and str(value) == "Event loop is closed":
            return
        previous(kind, value, tb)

    hook._tierax_quiet = True
    sys.excepthook = hook
