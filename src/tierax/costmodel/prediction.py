"""The model's answer for a plan (:class:`Prediction`): peak device bytes, host bytes, step time,
and the terms they are made of (:class:`Breakdown`), typed; the JSON form is generated from the
fields, under the keys ``--json`` output and the records have always used."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from tierax.costmodel.resources import StepSplit
from tierax.costmodel.state import StateCost

# Where the peak is (:attr:`Breakdown.peak_phase`), in words.
PHASE_TEXT = {
    "layer backward": "in a layer backward",
    "loss": "at the loss",
    "update": "in the streamed optimizer update",
    "accumulation": "in a gradient accumulation",
}


@dataclass(frozen=True)
class Breakdown:
    """The terms of a prediction, per device (bytes, seconds per step; a step of ``grad_accum``
    microbatches counts a microbatch's seconds that many times where noted)."""

    # --- device memory: the terms of the peak (:func:`peak_rows`) ---
    state_bytes: int  # parameters, gradients and AdamW state, all on device
    state_device_bytes: int  # of those, what the plan's state placements leave on device
    activation_bytes: int  # activations kept on device (carries, kept names, no-remat extras)
    staging_bytes: int  # offloaded activations' slices staged on device (the largest group's)
    workspace_bytes: int  # one layer's backward workspace
    logits_bytes: int  # at the loss: the logits, their gradient, the head's gradient
    fixed_device_bytes: int  # the runtime's fixed device memory
    stack_copy_bytes: int  # XLA's transposed copies of stacked weights
    embed_grad_bytes: int  # gradients not yet written at the loss
    late_grad_bytes: int  # of the state, what the layers' backward does not hold (written after)
    after_backward_bytes: int  # all device bytes after the layers' backward (0: no such phase)
    accumulator_device_bytes: int  # the float32 gradient accumulator left on device (A > 1)
    # --- device memory: each phase as the peak counts it, and the phase that peaks ---
    peak_phase: str  # a key of PHASE_TEXT
    layer_phase_bytes: int
    loss_phase_bytes: int
    update_phase_bytes: int  # the streamed optimizer update
    accumulation_phase_bytes: int  # 0: no offloaded accumulator (the phase is not separate)
    # --- fitting: what `fits` compares with what ---
    assigned_peak_bytes: int  # the peak XLA:TPU assigns (= the peak on other targets)
    reported_excess_bytes: int  # what an older libtpu reports beyond its assignment
    fit_limit_bytes: int
    fit_limit: str  # that limit in words
    # --- host memory ---
    activation_host_bytes: int  # offloaded activations (the state's: ``state``)
    # --- time (a microbatch's unless noted) ---
    compute_s: float  # forward + backward, no recomputation, HBM-bound work included
    hbm_s: float  # of compute_s, the non-matmul work at HBM bandwidth
    fused_attention_s: float  # of compute_s, fused attention kernels
    recompute_s: float
    recompute_hbm_s: float  # of recompute_s, at HBM bandwidth
    transfer_s: float  # offloaded activations' copies, both directions
    exposed_d2h_s: float
    exposed_h2d_s: float
    collective_s: float
    exposed_collective_s: float
    critical_collective_s: float  # of collective_s, what the layers wait for
    interference_s: float  # compute slowed by the communication it hides
    first_touch_s: float  # per step, CPU only
    transpose_s: float  # CPU only
    accumulate_s: float  # per step: the accumulator's additions
    microbatch_s: float  # a microbatch's seconds less the update's HBM time
    update_hbm_s: float  # per step: the optimizer update's HBM time
    # --- work (per step) ---
    executed_flops: float
    model_flops: float
    # --- what was predicted ---
    grad_accum: int
    schedule: str
    mechanism: str
    rates: Mapping[str, str]  # each rate's source
    network: Mapping[str, dict]  # mesh axis → its link (axes with a link only)
    # --- the training state's placements (JSON keys ``state_*``) ---
    state: StateCost
    # --- XLA's schedule: the backward's host loads issued where consumed (a TPU step peaking
    # above its scheduler's limit: tierax.costmodel.predict.copies_serialized) ---
    copies_serialized: bool = False
    # TPU targets: XLA:TPU's scheduler limit (Rates.scheduler_limit_bytes); a step peaking above it
    # is where XLA:TPU also rematerialises on its own, which the step time does not price.  0: none.
    scheduler_limit_bytes: int = 0

    @property
    def exposed_loads_s(self) -> float:
        """The host loads the step waits for: the backward's (h2d) and the streamed optimizer
        update's (it waits for a layer's state before updating it; the stores behind it are
        awaited later)."""
        return self.exposed_h2d_s + self.state.exposed_s

    def to_json(self) -> dict:
        """The fields by name, the state's under its own ``state_*`` keys."""
        out = {
            f.name: dict(v) if isinstance(v := getattr(self, f.name), Mapping) else v
            for f in dataclasses.fields(self)
            if f.name != "state"
        }
        return out | self.state.to_json()

    @classmethod
    def from_json(cls, d: Mapping) -> Breakdown:
        """The value :meth:`to_json` wrote (``--json`` output, a record's prediction).

        Raises:
          KeyError: a field the JSON lacks (a record from before the field existed).
        """
        fields = [f for f in dataclasses.fields(cls) if f.name != "state"]
        # a field with a default may be missing from a record written before it existed
        names = [f.name for f in fields if f.name in d or f.default is dataclasses.MISSING]
        return cls(**{n: d[n] for n in names}, state=StateCost.from_json(d))


@dataclass(frozen=True)
class Prediction:
    fits: bool
    peak_device_bytes: int
    device_capacity_bytes: int
    host_bytes: int
    step_time_s: float
    tflops_per_device: float
    breakdown: Breakdown
    # the step time by resource (tierax.costmodel.resources); None: not split
    split: StepSplit | None = None

    @property
    def xla_may_rematerialize(self) -> bool:
        """On a TPU target, whether XLA:TPU's rematerialization pass likely recomputes on its own,
        compute the step time does not price (a compile finds and prices it:
        :mod:`tierax.xla.recompute`): a fitting plan whose device peak, with the training state it
        keeps on the host, is above the scheduler limit.  The state counts: in the chip check's
        state-offload plans (bench/results/chip/tpu_check_state.json, tpu_check_state_mb40.json)
        the model's peak is within the limit and XLA's compile of each recomputes on its own."""
        b = self.breakdown
        lim = b.scheduler_limit_bytes
        return bool(lim) and self.fits and self.peak_device_bytes + b.state.host_bytes > lim

    def to_json(self) -> dict:
        return {
            "fits": self.fits,
            "peak_device_bytes": self.peak_device_bytes,
            "device_capacity_bytes": self.device_capacity_bytes,
            "host_bytes": self.host_bytes,
            "step_time_s": self.step_time_s,
            "tflops_per_device": self.tflops_per_device,
            "xla_may_rematerialize": self.xla_may_rematerialize,
            "breakdown": self.breakdown.to_json(),
        } | ({"split": self.split.to_json()} if self.split is not None else {})


def phase_text(b: Breakdown) -> str:
    """Where the predicted peak is, in words ("in a layer backward", "after the layers'
    backward", "at the loss", "in the streamed optimizer update", "in a gradient
    accumulation")."""
    return "after the layers' backward" if after_backward_peaks(b) else PHASE_TEXT[b.peak_phase]


def peak_rows(b: Breakdown) -> list[tuple[str, int]]:
    """The terms of the predicted peak, in the phase that peaks (:class:`FixedTerms`: a layer's
    backward holds its workspace, the loss the logits and their gradient, less the embedding and
    head gradients not yet written): (label, bytes) rows that sum to the peak."""
    if b.peak_phase == "update":  # the streamed update: the state left on device, its slices
        return [
            ("params + grads + AdamW left on device", b.state_device_bytes),
            ("the update's staged state slices", b.state.staging_bytes),
            ("the runtime's fixed device memory", b.fixed_device_bytes),
        ]
    if b.peak_phase == "accumulation":  # a microbatch's gradients added to the accumulator
        return [
            ("params + grads + AdamW left on device", b.state_device_bytes),
            ("the gradient accumulator left on device", b.accumulator_device_bytes),
            ("the accumulation's staged slices", b.state.accum_staging_bytes),
            ("the runtime's fixed device memory", b.fixed_device_bytes),
        ]
    loss = b.peak_phase == "loss"
    on_device = b.state_device_bytes  # moments on host leave the peak
    tail = [("activations on device", b.activation_bytes), ("transfer staging", b.staging_bytes)]
    if b.accumulator_device_bytes:
        tail.append(("the float32 gradient accumulator on device", b.accumulator_device_bytes))
    if b.fixed_device_bytes:
        tail.append(("the runtime's fixed device memory", b.fixed_device_bytes))
    if after_backward_peaks(b):
        freed = b.state_bytes - on_device
        return [
            (
                "after the layers' backward: params + grads + AdamW"
                + (" on device" if freed else "")
                + ", the head's gradient and what it is made from",
                b.after_backward_bytes - freed,
            ),
            *tail,
        ]
    less = b.embed_grad_bytes if loss else b.late_grad_bytes
    state = on_device - less
    not_yet = "not yet written" if loss else "written after the layers"
    rows = [
        (
            "params + grads + AdamW"
            + (" on device" if on_device != b.state_bytes else "")
            + (f", less the embedding and head gradients {not_yet}" if less > 0 else "")
            + (", with the loss's buffer held through the layers" if less < 0 else ""),
            state,
        ),
        *tail[:2],
        ("logits, their gradient, the head's gradient", b.logits_bytes)
        if loss
        else ("one layer's workspace", b.workspace_bytes),
        ("XLA's transposed weight stacks", b.stack_copy_bytes),
        *tail[2:],
    ]
    total = b.loss_phase_bytes if loss else b.layer_phase_bytes
    rest = total - sum(n for _, n in rows)
    if rest:  # the layer phase of the group that peaks: its own workspace, its kept reads
        rows.append(
            (
                "the peaking group's workspace beside the largest, less the kept names it reads "
                "in place from their stacks",
                rest,
            )
        )
    return rows


def after_backward_peaks(b: Breakdown) -> bool:
    """Whether the layer phase's peak is after the layers' backward (the head's gradient and what
    it is made from), not in a layer's backward."""
    if b.peak_phase != "layer backward" or not b.after_backward_bytes:
        return False
    freed = b.state_bytes - b.state_device_bytes
    after = (
        b.after_backward_bytes
        - freed
        + b.activation_bytes
        + b.staging_bytes
        + b.accumulator_device_bytes
        + b.fixed_device_bytes
    )
    return after == b.layer_phase_bytes
