"""The one place where XLA flags and backend options are set.

Everything here must happen before the JAX backend starts (the first JAX
operation).  ``configure`` refuses to run later instead of silently doing nothing.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass

from tierax.errors import TieraxError

# Named presets of XLA GPU flags (registered, and ignored, on CPU).
PRESETS: dict[str, tuple[str, ...]] = {
    "none": (),
    "lhs": ("--xla_gpu_enable_latency_hiding_scheduler=true",),
    "lhs-pipelined": (
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "--xla_gpu_enable_pipelined_host_offloading=true",
    ),
}


# Deviceless GPU compilation has no autotuner; XLA's Triton GEMM tiling then fails on some
# small shapes ("Couldn't find output tile sizes"), so deviceless compiles use cuBLAS GEMMs.
DEVICELESS_FLAGS: tuple[str, ...] = ("--xla_gpu_enable_triton_gemm=false",)


# libtpu options for every TPU program tierax compiles or runs (LIBTPU_INIT_ARGS, read when libtpu
# loads).  XLA:TPU may run the LM head's weight-gradient reduce-scatter as a windowed einsum, and
# where it does (on 8 v5p chips, not on 4) it writes the logits' gradient and a transposed copy of
# it for that loop: a second logits-sized buffer at the step's peak, for one collective of the head
# gradient's size.  Its choice depends on the slice in a way the cost model cannot know, so the
# step asks for a plain collective (the peaks with and without: bench/results/tpu_compile.json).
TPU_FLAGS: tuple[str, ...] = ("--xla_tpu_enable_windowed_einsum_for_reduce_scatter=false",)
LIBTPU_ARGS = "LIBTPU_INIT_ARGS"
# libtpu options MaxText's own ahead-of-time compiler (train_compile) adds before it compiles
# MaxText's step (tierax.xla.maxtext_step compiles that step with them, not with TPU_FLAGS).
MAXTEXT_TPU_FLAGS: tuple[str, ...] = ("--xla_tpu_spmd_rng_bit_generator_unsafe=true",)


def libtpu_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{LIBTPU_INIT_ARGS: ...}`` with :data:`TPU_FLAGS` ahead of what the environment already
    has (a flag set there is kept as it is: the user's value wins); empty when it sets them all."""
    return libtpu_env_with(TPU_FLAGS, environ)


def libtpu_env_with(flags: tuple[str, ...], environ: Mapping[str, str] | None = None) -> dict:
    """``{LIBTPU_INIT_ARGS: ...}`` with ``flags`` ahead of what the environment already has (the
    user's value of a flag wins); empty when it sets them all."""
    env = os.environ if environ is None else environ
    user = env.get(LIBTPU_ARGS, "")
    given = {f.split("=", 1)[0].lstrip("-") for f in user.split()}
    ours = [f for f in flags if f.split("=", 1)[0].lstrip("-") not in given]
    return {LIBTPU_ARGS: " ".join([*ours, user]).strip()} if ours else {}


def _backends_started() -> bool:
    from jax._src import xla_bridge  # no public query exists

    return xla_bridge.backends_are_initialized()


def _has_nvidia_driver() -> bool:
    return os.path.exists("/proc/driver/nvidia/version")


def _has_tpu() -> bool:
    # A TPU VM exposes its chips as /dev/accel* (v4, v5e, v6e) or as VFIO groups under /dev/vfio
    # (v5p and later); the directory alone (/dev/vfio/vfio, the container) is not a chip.
    groups = [g for g in glob.glob("/dev/vfio/*") if os.path.basename(g) != "vfio"]
    return bool(glob.glob("/dev/accel*")) or bool(groups)


@dataclass(frozen=True)
class Accelerators:
    """What the machine has, as the platform choice reads it (:func:`choose_platforms`)."""

    nvidia: bool
    tpu: bool

    @classmethod
    def present(cls) -> Accelerators:
        return cls(nvidia=_has_nvidia_driver(), tpu=_has_tpu())

    @property
    def any(self) -> bool:
        return self.nvidia or self.tpu


def choose_platforms(
    *, env_platforms: str, found: Accelerators, host_devices: bool, run_step: bool
) -> str | None:
    """The ``jax_platforms`` value a verb starts JAX with; None leaves JAX's own choice.

    ``env_platforms``: JAX_PLATFORMS as set (the user's choice wins: JAX reads it).
    ``host_devices``: the user asked for N host CPU devices (``--devices N``): the CPU.
    ``run_step``: the verb runs a step on the local devices (bench, train, verify, profile,
    calibrate): where an accelerator is present JAX is left to start it.  Every other case (a verb
    that only traces or compiles without a device, or a machine without an accelerator) is the
    CPU, so that an installed CUDA plugin or libtpu does not try to start (and, for libtpu, take
    the chip's lock)."""
    if env_platforms:
        return None
    if host_devices or not (run_step and found.any):
        return "cpu"
    return None


def compiles_on_attached_tpu(*, env_platforms: str, found: Accelerators) -> bool:
    """Whether a compile for a TPU target starts the machine's TPU backend (the attached chip's
    own compile, :func:`tierax.launch.start_tpu_compile`) rather than compiling deviceless: a TPU
    is present and JAX_PLATFORMS does not choose (``JAX_PLATFORMS=cpu`` asks for deviceless)."""
    return not env_platforms and found.tpu


def cpu_without_accelerator() -> bool:
    """For the Python API's import (before JAX starts): where JAX_PLATFORMS is unset and the
    machine has neither an NVIDIA driver nor a TPU, choose JAX's ``cpu`` platform, so that an
    installed CUDA plugin does not try to start (and print its traceback) — what ``configure``
    does for the CLI's verbs.  Nothing changes where JAX already started or a platform was chosen.
    Returns whether it chose ``cpu``."""
    if os.environ.get("JAX_PLATFORMS") or _has_nvidia_driver() or _has_tpu():
        return False
    import jax

    if jax.config.jax_platforms or _backends_started():
        return False
    jax.config.update("jax_platforms", "cpu")
    return True


def expects_gpu() -> bool:
    """Whether ``configure`` (with ``platforms=None``) will leave JAX free to start a GPU
    backend."""
    chosen = os.environ.get("JAX_PLATFORMS", "")
    return (chosen == "" and _has_nvidia_driver()) or any(
        p in chosen for p in ("cuda", "gpu", "rocm")
    )


def configure(
    *,
    cpu_devices: int | None = None,
    preset: str = "none",
    platforms: str | None = None,
    deviceless_gpu: bool = False,
    cpu_collectives: str | None = None,
    env: Mapping[str, str] | None = None,
    dump_dir: str | None = None,
    run_step: bool = False,
) -> list[str]:
    """Set backend options before JAX starts; returns the XLA flags added.

    Args:
      cpu_devices: number of host CPU devices to create.
      preset: a key of :data:`PRESETS`.
      platforms: value for ``jax_platforms``.  When None, :func:`choose_platforms` decides:
        the accelerator JAX finds where ``run_step`` and the machine has one, else ``cpu``.
      deviceless_gpu: compiling for a GPU target without a GPU: the host platform
        only, plus :data:`DEVICELESS_FLAGS`.
      cpu_collectives: cross-process collectives on the CPU backend (``"gloo"`` for
        multi-process CPU runs under ``jax.distributed``).
      env: runtime environment variables the backend reads at start-up (e.g.
        ``XLA_PYTHON_CLIENT_MEM_FRACTION``), set here so they precede it.
      dump_dir: XLA writes its compiled modules there (``--xla_dump_to``: the optimised HLO, its
        buffer assignment and live ranges), for tracing what a compiled peak holds.
      run_step: the caller runs a step on the local devices (an accelerator is used where present).

    Raises:
      TieraxError: unknown preset, bad device count, or the backend has already started.
    """
    if preset not in PRESETS:
        raise TieraxError(f"unknown XLA preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    if cpu_devices is not None and cpu_devices < 1:
        raise TieraxError(f"--devices must be ≥ 1, got {cpu_devices}")
    import jax

    if deviceless_gpu:
        platforms = "cpu"
    if platforms is None:
        platforms = choose_platforms(
            env_platforms=os.environ.get("JAX_PLATFORMS", ""),
            found=Accelerators.present(),
            host_devices=cpu_devices is not None,
            run_step=run_step,
        )
    flags = list(PRESETS[preset]) + (list(DEVICELESS_FLAGS) if deviceless_gpu else [])
    flags += [f"--xla_dump_to={dump_dir}"] if dump_dir else []
    if platforms is not None and platforms == jax.config.jax_platforms:
        platforms = (
            None  # already in effect (e.g. a library caller configured first): nothing to change
        )
    if cpu_devices is not None and cpu_devices == jax.config.jax_num_cpu_devices:
        cpu_devices = None  # the same: a verb called in a process that already made these devices
    wanted = cpu_devices is not None or flags or platforms is not None or cpu_collectives or env
    if not wanted:
        return []
    if _backends_started():
        raise TieraxError(
            "XLA options must be set before JAX starts its backend; call "
            "tierax.launch.flags.configure before any JAX operation"
        )
    if platforms is not None:
        jax.config.update("jax_platforms", platforms)
    if cpu_devices is not None:
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    if cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    os.environ.update(env or {})
    if flags:
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()
    return flags
