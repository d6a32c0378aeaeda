"""What a layer's backward reads from the saved stacks on a TPU instead of holding it in its
workspace: the layer phase's rows of :mod:`tierax.costmodel.linear_terms`.

The workspace of a layer in flight (:func:`tierax.costmodel.fixed._workspace`) counts on a TPU the
residuals XLA:TPU writes when the layer is recomputed in its backward
(:func:`tierax.tracing.hbm.written_residual_bytes`).  A value the plan keeps on device is not
recomputed: XLA:TPU's backward of the layer reads the layer's slice of its saved stack, which the
kept activations already count for every layer.  So a name kept on device that is itself one of the
written residuals (:attr:`tierax.tracing.inventory.Activation.read_in_place`: a matmul's output,
not a RoPE-rotated or normalised value made elementwise from others) is counted once, in the stack:
each group's layer phase is its backward's bytes (:meth:`FixedTerms.layer_backward_bytes` of its
workspace) plus the kept activations less the bytes per layer of its kept, read-in-place names.  The
loss phase holds the stacks and no layer in flight: it keeps every kept activation.

Read from XLA:TPU's buffer assignment and live ranges (libtpu 0.0.52) of MaxText's compiles
(``bench/maxtext_fidelity.py --dump-dir``): in llama3-8b-v5p-minimal (4 v5p, 1 × 1024,
``remat_policy=minimal``: q, k, v, out_proj, mlpwi_0 and mlpwi_1 saved) the backward loop's
largest live set holds the saved stacks and reads the layer's slices in the fusions that use them
(no copy of a slice is live), the workspace then holds the gathered weights and the non-saved
residuals; in mistral-7b-v6e-minimal (4 v6e, 1 × 2048) the same stacks, and XLA makes layout copies
of two of the slices (mlpwi_0's and mlpwi_1's) while its peak holds two of the MLP's unsharded
compute-dtype weight gradients instead of the layer's gathered weights: the rule reads the stacks
once and keeps the workspace's own reading of the rest.  Under ``remat_policy=full`` (nothing but
the carry kept) nothing changes.  The carry (the layer input, saved under every plan) is left as the
workspace counts it.  GPU targets hold every residual (XLA:GPU writes a GEMM's operands): no rows.
"""

from __future__ import annotations

from tierax import hardware
from tierax.tracing.inventory import Inventory


def applies(rates) -> bool:
    """Whether the layer's backward reads kept names in place: TPU targets."""
    return rates.target in hardware.TPU_TARGETS


def read_bytes_per_layer(inv: Inventory, group: str, name: str) -> int:
    """Bytes per layer of ``group``'s ``name`` that its backward reads from the saved stack when
    the plan keeps it on device (0: a value the workspace does not hold itself, or no residual):
    what the workspace counts of it, its logical bytes (its stack's tiled bytes, counted in the
    kept activations, may be more: :mod:`tierax.hardware.tpu_tiling`)."""
    for g in inv.groups:
        if g.name == group:
            for a in g.activations:
                if a.name == name and a.read_in_place:
                    return int(a.logical_held_bytes_per_layer)
    return 0
