"""What a deviceless compile reports (:class:`CompileResult`), and an out-of-memory refusal as
one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tierax.xla.oom import OutOfMemory


@dataclass(frozen=True)
class OffloadedName:
    group: str
    name: str
    expected_bytes: int  # per device, from the abstract trace
    host_bytes: (
        int  # per device, the matching host buffer found in the compiled program (0 if none)
    )
    # op_name (the name XLA kept in the store's metadata), size (none kept), "" (none)
    matched_by: str = "op_name"

    @property
    def on_host(self) -> bool:
        return self.host_bytes > 0


@dataclass(frozen=True)
class CompileResult:
    model: str
    plan: str
    target: str
    devices: int
    mesh: dict
    microbatch: int
    seq: int
    xla_preset: str
    fits: bool
    device_peak_bytes: (
        int | None
    )  # an out-of-memory compile: what XLA says it needs (None: it did not say)
    device_capacity_bytes: int
    device_argument_bytes: (
        int | None
    )  # None: XLA refused the program (out_of_memory), so no memory analysis
    device_output_bytes: int | None
    device_alias_bytes: int | None
    device_temp_bytes: int | None
    host_temp_bytes: int | None
    offloaded: tuple[OffloadedName, ...]
    overlap: dict
    compile_time_s: float
    attention: str = ""  # the model config's attention implementation (xla | blockwise | cudnn)
    notes: tuple[str, ...] = field(default_factory=tuple)
    cudnn_calls: int = 0  # cuDNN fused-attention custom calls in XLA's program (forward + backward)
    cudnn_workspace_bytes: int = (
        0  # their backward workspace from shapes, included in device_peak_bytes
    )
    # fp8 GEMMs in XLA's program as written (tierax.xla.hlo.fp8_gemms): cuBLASLt fp8 calls,
    # cuDNN block-scaled (MXFP8) calls, plus dots of two fp8 operands (a deviceless compile's
    # Triton GEMM fusions)
    fp8_gemms: int = 0
    # of those, cuDNN's block-scaled MXFP8 GEMM calls (quantization: mxfp8)
    block_scaled_gemms: int = 0
    quantization: str = ""  # the model config's quantization ("", "fp8" or "mxfp8")
    tpu_custom_calls: int = 0  # tpu_custom_call instructions (Pallas kernels: splash attention)
    libtpu_version: str = ""  # the libtpu that compiled a TPU target ("" for a GPU target)
    device_limit_bytes: int = (
        0  # what "fits" is judged against (hardware.fit_limit_bytes, or XLA's own figure)
    )
    out_of_memory: bool = False  # XLA refused to compile the program: it does not fit
    xla_error: str = ""  # XLA's message when it refused
    predicted: dict = field(
        default_factory=dict
    )  # the cost model's peak, host bytes and fits for this plan
    # XLA's host-memory arguments (a plan's training state in pinned_host) and the plan's
    # offloaded training-state bytes (the cost model's, tierax.costmodel.state).
    host_argument_bytes: int = 0
    state_host_bytes: int = 0
    # MaxText's step: the flags XLA compiled it with, as the variable that carries them
    # (LIBTPU_INIT_ARGS for a TPU target, XLA_FLAGS for a GPU; tierax.xla.maxtext_step)
    xla_environment: dict = field(default_factory=dict)
    # XLA's rematerialization clones (tierax.xla.recompute.summary): compute the plan did not ask
    # for, where the program reached the compiler's memory limit ({}: XLA refused the program)
    xla_recompute: dict = field(default_factory=dict)
    # the attached device the program was compiled for ("TPU v5 lite"), or "" (deviceless)
    compiled_on: str = ""
    # XLA:TPU compiled the program (so its buffers fit) while memory_analysis() reports a peak over
    # its limit: the figure is the libtpu's over-report, not the assignment (tierax.hardware.libtpu)
    peak_over_reported: bool = False

    @property
    def offloaded_bytes_by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.offloaded:
            out[o.name] = out.get(o.name, 0) + o.host_bytes
        return out

    def to_json(self) -> dict:
        d = asdict(self)
        d["offloaded"] = [asdict(o) | {"on_host": o.on_host} for o in self.offloaded]
        d["offloaded_bytes_by_name"] = self.offloaded_bytes_by_name
        return d


def refused_result(
    refused: OutOfMemory,
    *,
    cfg,
    plan,
    target,
    devices,
    shape,
    microbatch,
    seq,
    xla_preset,
    spec,
    limit,
    compile_s,
    predicted,
) -> CompileResult:
    """An out-of-memory compile as a result: it does not fit; XLA's stated figures, no memory
    analysis."""
    notes = [f"XLA refused the program for device memory: {refused.message}"]
    if refused.required_bytes is not None:
        notes.append(
            "XLA's figures are its message's, to 0.01 GiB; the program was not compiled, so "
            "there is no memory analysis, host buffer or overlap check"
        )
    return CompileResult(
        model=cfg.name,
        plan=plan.name,
        target=target,
        devices=devices,
        mesh=shape.to_dict(),
        microbatch=microbatch,
        seq=seq,
        xla_preset=xla_preset,
        fits=False,
        device_peak_bytes=refused.required_bytes,
        device_capacity_bytes=spec.device_memory_bytes,
        device_argument_bytes=None,
        device_output_bytes=None,
        device_alias_bytes=None,
        device_temp_bytes=None,
        host_temp_bytes=None,
        offloaded=(),
        overlap={},
        compile_time_s=compile_s,
        attention=cfg.attention,
        notes=tuple(notes),
        device_limit_bytes=refused.available_bytes or limit,
        out_of_memory=True,
        xla_error=refused.message,
        predicted=predicted,
    )
