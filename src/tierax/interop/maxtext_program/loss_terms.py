"""What MaxText's step holds on a GPU at its loss, during its layers' backward and after it, that
tierax's own step does not: the Program's ``loss_bytes``, ``after_backward_bytes``,
``late_grad_bytes`` and ``stack_copy_params`` for a GPU target (:func:`gpu_terms`).

Read from XLA:GPU's buffer assignment and live ranges of MaxText's compiles of the untiled dense
cases of ``bench/results/maxtext_fidelity.json`` (qwen3-8b-h200-minimal, llama3-8b-h200-full and
llama3-8b-h200-qkv-offloaded; ``bench/maxtext_fidelity.py --dump-dir``), FSDP over 4 devices.
MaxText's step on a GPU differs from tierax's there in four places:

* **The loss** (``loss_bytes``): MaxText casts the head to the compute dtype and gathers it over
  FSDP (``[emb, vocab]`` in ``dtype``, unsharded), writes the logits in the compute dtype and their
  gradient in it (``[tokens, vocab]`` each, split over tensor as the trace splits the logits);
  ``cast_logits_to_fp32``'s float32 logits live only inside the cross-entropy's fusions (XLA writes
  row reductions of them, no float32 ``[tokens, vocab]``).  XLA schedules the head's weight
  gradient after the layers' backward: no head gradient is live at the loss, and neither is the
  embedding's (the cost model leaves both out of the state there, ``embed_grad_bytes``).
* **The layers' backward** (``late_grad_bytes``): the logits' gradient is held through it (the cost
  model's GPU workspace already counts it), the embedding's and head's float32 gradients are not
  written yet: the state's gradients less those.
* **After the layers' backward** (``after_backward_bytes``): the head's weight gradient, in the
  compute dtype and unsharded, beside the parameters, the optimizer state and every layer's
  gradient (``grad_dtype``, sharded); with it the larger of its operand, the held logits' gradient
  (live until the matmul), and its reduce-scatter's output (a compute-dtype shard) with the
  embedding's gradient scatter-added in the compute dtype (a shard; XLA starts it while the head's
  gradient is live in the llama3-8b and qwen3-8b cases, after it in a smaller one).
* **Transposed stack copies** (``stack_copy_params``): before the forward loop XLA:GPU copies every
  stacked layer weight's float32 shard (MaxText stacks a layer weight with the layer axis second,
  ``param_scan_axis``) to a layer-first layout, held through the loss and the layers' backward.
  Routed-expert groups are left out here (:mod:`.weight_stacks` prices their stacks).

At the loss XLA:GPU's live set holds no layer gradient (their accumulators are zeroed after the
loss's forward, for the backward loop), but its temp is the highest offset its buffer assignment
reaches, not the live set's peak: XLA lays the temp out twice — largest buffers first (spatial) and
longest-lived first (temporal), each at the best-fitting free offset over its live range — and
keeps the smaller heap.  Which one wins, and so whether the layer gradients' bytes stand on top of
the loss's buffers, follows from how the loss's buffers compare with the layer gradients
(``loss_bytes`` by :func:`gpu_loss_bytes`):

* **The loss's buffers larger than the layer gradients** (the gathered head and the two
  ``[tokens, vocab]`` buffers above ``grad_dtype`` × the layer stacks' parameters per device): the
  spatial layout puts the head's slot (the gathered head at the loss, the head's gradient after
  the layers' backward) and the logits' slots lowest, the stack copies above them and the layer
  gradients' accumulators (live from the loss's backward to the optimizer, overlapping both uses
  of those slots) above those: XLA's temp holds the layer gradients on top of the loss's buffers,
  as the cost model's loss phase counts them (the state with the layer gradients, plus
  ``loss_bytes`` = the buffers themselves).
* **The loss's buffers no larger than the layer gradients**: the temporal layout puts the stack
  copies and the layer gradients' accumulators lowest, the held logits' gradient beside them, and
  the gathered head and the logits inside the gradients' slots, free until the loss is done (the
  accumulators are zeroed after it); XLA's peak is then
  the layers' backward (the cost model's layer phase) and the loss adds to the state only the
  logits' gradient (``loss_bytes`` = one ``[tokens, vocab]`` in the compute dtype).

Read from XLA:GPU's buffer assignments of ``bench/maxtext_fidelity.py``'s llama3-8b-h200-full
cases: at 2 layers the spatial layout (the head and the two logits buffers about 3.6 times the
layer gradients), at 8 layers (``-8L``: the layer gradients larger) the temporal one, the head and
the logits inside the gradients' slots as in mixtral-8x7b-h200-full's and in the small config
of ``tests/test_maxtext_loss_terms.py`` at 16 layers.  Where the two are close
(llama3-8b-h200-full at 4 to 7 layers) XLA's spatial layout fits the head's gradient in beside the
layer gradients and its temp is up to one logits buffer below the cost model's loss phase.

Where the loss was not traced — a tiled loss (``num_vocab_tiling`` > 1), no FSDP, the head read
from the embedding (``logits_via_embedding``) — :func:`gpu_terms` leaves ``loss_bytes`` None and
the cost model keeps its own reading of the loss (tierax's step); the stack copies are made wherever
FSDP shards the stacks (none without it: :mod:`.weight_stacks`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tierax.interop.maxtext_program.config import embedding_shards


@dataclass(frozen=True)
class GpuTerms:
    """The Program fields :func:`gpu_terms` fills (:class:`tierax.tracing.program.Program`)."""

    loss_bytes: int | None
    after_backward_bytes: int
    late_grad_bytes: int
    stack_copy_params: float


def applies(config, inv) -> bool:
    """Whether MaxText's GPU loss is the traced one: untiled, under FSDP, with its own head."""
    return (
        int(config.num_vocab_tiling) == 1
        and embedding_shards(inv) > 1
        and not bool(getattr(config, "logits_via_embedding", False))
    )


def loss_layout_bytes(head: int, logits: int, layer_grads: int) -> int:
    """The bytes MaxText's loss adds on a GPU to the state (with its layer gradients' bytes) as
    XLA:GPU's buffer assignment lays the loss out (module docstring): the gathered ``head`` and
    two ``logits``-sized buffers (the logits, their gradient) below the layer gradients where they
    are larger than the ``layer_grads`` bytes; where they are not, the head and the logits inside
    the gradients' slots and only the logits' gradient beside them."""
    if head + 2 * logits <= layer_grads:
        return int(logits)
    return int(head + 2 * logits)


def gpu_loss_bytes(config, inv) -> int:
    """The bytes MaxText's loss holds on a GPU beside the state (less the embedding's and head's
    gradients) and the kept activations (:func:`loss_layout_bytes`): the head cast to the compute
    dtype and gathered (``[emb, vocab / tensor]``), the logits and their gradient in the compute
    dtype (``[tokens, vocab / tensor]`` each), against the layer stacks' gradients
    (``grad_dtype``, per device)."""
    import jax.numpy as jnp

    c = jnp.dtype(config.dtype).itemsize
    g = jnp.dtype(config.grad_dtype).itemsize
    tensor = int(inv.mesh.get("tensor", 1))
    vocab = int(config.vocab_size) // tensor
    tokens = inv.microbatch * inv.seq
    return loss_layout_bytes(
        c * int(config.emb_dim) * vocab, c * tokens * vocab, g * layer_grad_params(inv)
    )


def layer_grad_params(inv) -> int:
    """The layer stacks' parameters per device (their gradients: the state's, less the embedding's
    and head's)."""
    return int(sum(n for _, n in inv.group_param_counts))


def gpu_late_grad_bytes(config, inv) -> int:
    """The state's gradient bytes MaxText's step on a GPU writes only after the layers' backward:
    the embedding's and head's (every gradient outside the layer stacks), in ``grad_dtype``."""
    import jax.numpy as jnp

    g = jnp.dtype(config.grad_dtype).itemsize
    return int(inv.grad_bytes - g * layer_grad_params(inv))


def gpu_after_backward_bytes(config, inv) -> int:
    """All device bytes of MaxText's step on a GPU after the layers' backward: the parameters and
    optimizer state, every layer's gradient (``grad_dtype``, sharded), the head's gradient in the
    compute dtype, unsharded over FSDP (``[emb, vocab / tensor]``), and the larger of the logits'
    gradient it is computed from (``[tokens, vocab / tensor]``) and its reduce-scatter's output
    with the embedding's gradient (a compute-dtype shard each)."""
    import jax.numpy as jnp

    c = jnp.dtype(config.dtype).itemsize
    g = jnp.dtype(config.grad_dtype).itemsize
    tensor = int(inv.mesh.get("tensor", 1))
    head = int(config.emb_dim) * int(config.vocab_size) // tensor
    logits = inv.microbatch * inv.seq * int(config.vocab_size) // tensor
    fsdp = embedding_shards(inv)
    return int(
        inv.param_bytes
        + inv.optimizer_bytes
        + g * layer_grad_params(inv)
        + c * head
        + max(c * logits, 2 * (c * head // fsdp))
    )


def gpu_stack_copy_params(inv, moe_groups=()) -> float:
    """The per-device parameters of the stacked layer weights XLA:GPU copies to a layer-first
    layout (every group's but the routed-expert groups named in ``moe_groups``; the layers' norm
    scales, which XLA leaves as they are, are counted with them: ``emb_dim`` per layer)."""
    return float(sum(n for name, n in inv.group_param_counts if name not in set(moe_groups)))


def gpu_terms(config, inv, moe_groups=()) -> GpuTerms:
    """MaxText's GPU terms for ``config`` and its inventory ``inv`` (module docstring): where the
    loss was not traced (:func:`applies`) ``loss_bytes`` None (the cost model's reading of the loss)
    and no after-backward phase or late gradients; the stack copies wherever FSDP shards the
    stacks (the layer scan's gathers make them, whatever the loss)."""
    stacks = gpu_stack_copy_params(inv, moe_groups) if embedding_shards(inv) > 1 else 0.0
    if not applies(config, inv):
        return GpuTerms(None, 0, 0, stacks)
    return GpuTerms(
        loss_bytes=gpu_loss_bytes(config, inv),
        after_backward_bytes=gpu_after_backward_bytes(config, inv),
        late_grad_bytes=gpu_late_grad_bytes(config, inv),
        stack_copy_params=stacks,
    )
