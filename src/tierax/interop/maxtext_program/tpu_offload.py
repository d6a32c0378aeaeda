"""Where XLA:TPU compiles MaxText's step under host offload as no deeper model's step: a layer stack
whose scan runs two iterations (:func:`unrolled_groups`, :func:`unrolled_note`) or once
(:func:`single_trip_note`), and what it holds on the host then (:func:`host_layout`).

Read from XLA:TPU's (libtpu 0.0.52) optimized HLO, buffer assignment and live ranges of MaxText's
compiles (``bench/maxtext_fidelity.py --dump-dir``; ``tierax compile --maxtext ... --dump-dir``):

* **The loops.**  Where the step offloads a name to the host, XLA:TPU unrolls a layer loop of two
  iterations: at 2 layers llama3-8b (``qkv_proj_offloaded``, v5p × 4, 1 × 1024) and mistral-7b
  (``custom``, q/k/v offloaded, v5p × 4) hold no loop, mixtral-8x7b (``qkv_proj_offloaded``, v6e ×
  4) only its expert kernels' inner loops, and so does gpt-oss-20b (``custom``, q/k/v offloaded,
  v6e × 4) at 4 layers, its scan's two blocks of two; the same dense and mixtral steps at 3
  layers, llama3-8b at 8 and the tests' tiny llama2-block config at 3 and 4 keep the forward and
  backward layer loops, as every 2-layer step that offloads nothing does (llama3-8b ``full`` and
  ``minimal`` on v5p).  The count is the scan's iterations: a group's ``num_layers``.
* **What the unrolled program holds that the looped one does not** (the 2-layer dumps): the
  optimizer update writes each stack's new float32 parameters and moments into temporaries laid
  out layer-major and copies them into the outputs (a looped program updates the stacks in place,
  at most one buffer of a kernel at a time passing through a temporary); how many of them are live
  at once is the scheduler's (mixtral-8x7b: all, with one kernel's per-layer gradients; llama3-8b:
  one kernel's three; mistral-7b: seven of nine).  At the loss the backward's gathered layer
  weights and its recomputed MLP activations are held, hoisted over it (llama3-8b).  The last
  layer's offloaded values take host buffers of their own besides the stacked residuals (a host
  round trip to its own backward): one layer's offloaded bytes more on the host where their live
  ranges meet the stacks' (llama3-8b, mixtral-8x7b), none where they do not (mistral-7b).

The cost model prices the looped program, what a stack of three layers or more compiles (the
3-layer compiles above: ``tierax compile --maxtext`` beside ``tierax simulate --maxtext``).  The
2-layer program's extra bytes follow XLA's schedule, not the shapes: they are not priced, and
:func:`unrolled_note` says where a prediction is of such a program.  On the host too: the unrolled
program writes its stacks (``bf16[2,1,1024,32|8,128]`` for llama3-8b's q, k and v) just before
the backward reads them, and the scheduler places their allocation and first writes either in the
forward, where the last layer's own buffers (``bf16[1,1024,32|8,128]``) are live beside them
(llama3-8b, mixtral-8x7b; gemma2-2b ``qkv-offload`` on v5e × 4, whose two trips of a local and a
global layer keep a stack per layer of the block and their last trip's layers' own buffers one
layer's at a time), or after those buffers' round trip, in the same offsets (mistral-7b, whose
layer is llama3-8b's).  Which of the two is neither the policy's nor the decoder block's: llama3-8b
under mistral-7b's ``custom`` keys and mistral-7b under ``qkv_proj_offloaded`` each hold their own
model's host bytes, and mistral-7b given llama3-8b's vocabulary (128,256) compiles to llama3-8b's
peak and host bytes (its dump: llama3-8b's schedule, the head gradient's reduce-scatter an
all-reduce, which moves the schedule around the loss); mixtral-8x7b at mistral-7b's vocabulary still
meets its stacks, so no vocabulary rule holds either (``bench/results/maxtext_fidelity.json``'s rows
``llama3-8b-v5p-custom``, ``mistral-7b-v5p-qkv-offloaded`` and
``mistral-7b-v5p-qkv-offloaded-v128k``).

* **A stack whose scan runs once** (:func:`single_trip_note`): XLA:TPU inlines it, and each layer's
  offloaded value gets a host buffer of its own (no stack): its forward copies the value to the
  host and straight back (the host copy's live range is the round trip's), the buffers packed in
  one host heap by those live ranges.  Where a layer's round trips end before the next layer's
  begin, the heap is one layer's values (:func:`host_layout`: olmo3-7b cut to 4 layers, its one
  four-layer block, ``qkv-offload``, v6e × 4: three ``bf16[1,1024,32,128]`` buffers reused by
  every layer; gpt-oss-20b at 2 layers, ``custom`` q/k/v offloaded, v6e × 4: one
  ``bf16[1,1024,64,64]`` query and two ``bf16[1,1024,8,64]`` (tiled), reused by both
  layers).  Where the scheduler stretches the round trips over the next layers, the heap holds
  several layers' at once, more than the rule's one (llama4-17b-16e cut to 4 layers, q/k/v
  offloaded on v5p × 8: three layers' queries and one layer's key and value live together; why
  there and not in the trips above was not read; not priced: an under-count, the note says so).

Not traced: a two-layer segment of tierax's own scanned step on a TPU, a step that offloads only the
training state (``optimizer_memory_host_offload``).
"""

from __future__ import annotations

from collections.abc import Iterable

# The layer scan's iterations XLA:TPU unrolls where the step offloads to the host (module
# docstring: unrolled at 2, looped at 3, 4 and 8).
UNROLLED_ITERATIONS = 2


def unrolled_groups(placements: dict, groups: Iterable) -> tuple[str, ...]:
    """The layer groups (:class:`~tierax.models.config.LayerGroup`) XLA:TPU unrolls under
    ``placements`` (group → name → Placement, :func:`tierax.plan.resolve`'s): those of
    :data:`UNROLLED_ITERATIONS` scanned layers (or blocks), where any name of the step is
    offloaded."""
    from tierax.plan import Placement

    offloads = any(p is Placement.OFFLOAD for names in placements.values() for p in names.values())
    if not offloads:
        return ()
    return tuple(g.name for g in groups if g.num_layers == UNROLLED_ITERATIONS)


def host_layout(groups: Iterable, target: str) -> tuple[tuple[str, tuple[int, int]], ...]:
    """How XLA:TPU holds each layer group's offloaded values on the host where its scan runs once
    (module docstring), for the Program's ``host_layout``: (group, (0, 1)), no stack and one
    layer's values in buffers of their own (a scanned block's largest layer's,
    :attr:`tierax.tracing.inventory.Activation.host_value_held_bytes`), each value's host round
    trip made in its layer's forward.

    The host holds a group's bytes only where the step offloads a name of it, so the layout is
    given for every one-trip group whatever the plan; none on a GPU, and none for a scan of more
    trips (an unrolled one's own buffers meet its stacks or not as the schedule places them: the
    stacks alone are priced)."""
    from tierax import hardware

    if hardware.get_target(target).kind != "tpu":
        return ()
    return tuple((g.name, (0, 1)) for g in groups if g.num_layers == 1)


def single_trip_note(placements: dict, groups: Iterable, target: str) -> str | None:
    """A note for a TPU ``target`` whose step offloads from a layer stack whose scan runs once
    (module docstring); None where none does."""
    from tierax import hardware
    from tierax.plan import Placement

    if hardware.get_target(target).kind != "tpu":
        return None
    once = [
        g.name
        for g in groups
        if g.num_layers == 1
        and any(p is Placement.OFFLOAD for p in placements.get(g.name, {}).values())
    ]
    if not once:
        return None
    return (
        f"host offload on {target}: the scan of {', '.join(once)} runs once, so XLA:TPU inlines "
        "it and gives each layer's offloaded value a host buffer of its own, packed by live range "
        "in one heap: the prediction's host bytes are one layer's values, the heap where each "
        "layer's host round trips end before the next layer's begin (where the schedule overlaps "
        "them it holds more); compare with a compile whose scan runs more than once"
    )


def unrolled_note(placements: dict, groups: Iterable, target: str) -> str | None:
    """A note for a TPU ``target`` whose step XLA unrolls (:func:`unrolled_groups`); None where it
    does not."""
    from tierax import hardware

    if hardware.get_target(target).kind != "tpu":
        return None
    unrolled = unrolled_groups(placements, groups)
    if not unrolled:
        return None
    return (
        f"host offload on {target}: XLA:TPU unrolls the layer loop of {', '.join(unrolled)} "
        f"({UNROLLED_ITERATIONS} iterations), a program no deeper model compiles (its update "
        "writes the stacks' new float32 state through temporaries, its backward's weights and "
        "recomputation are held over the loss, the last layer's offloaded values take host "
        "buffers of their own); the prediction prices the looped program: compare with a compile "
        f"whose layer scan runs {UNROLLED_ITERATIONS + 1} iterations or more"
    )
