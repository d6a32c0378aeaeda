"""Where XLA:TPU compiles MaxText's step under host offload as no deeper model's step: a layer stack
whose scan runs two iterations (:func:`unrolled_groups`, :func:`unrolled_note`).

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
:func:`unrolled_note` says where a prediction is of such a program.

* **A stack whose scan runs once** (:func:`single_trip_note`): XLA:TPU inlines it, and each layer's
  offloaded value gets a host buffer of its own (no stack), the buffers packed in one host heap by
  their live ranges, so the host holds less than the layers' offloaded bytes (llama4-17b-16e cut to
  4 layers, its one four-layer block, q/k/v offloaded on v5p × 8: the row
  llama4-17b-16e-v5p-qkv-offload-4L of bench/results/maxtext_fidelity.json, read from its dump; one
  layer's query was not offloaded at all).  Not priced: the note says so.

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
        "in one heap: it holds less than the prediction's host bytes, which count every layer's "
        "offloaded values (the looped program's stacks); compare with a compile whose scan runs "
        "more than once"
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
