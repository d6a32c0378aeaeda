"""MaxText's routed-expert stacks on a TPU where their scan runs a single trip: what XLA:TPU holds
then that a layer loop does not (:func:`tpu_moe_terms`: part of the Program's ``loss_bytes`` and
``late_grad_bytes``, its ``uncopied_stack_bytes`` and ``gathered_expert_bytes``).

MaxText scans each decoder stack (``scan_layers``) and wraps the scanned layer in
``jax.checkpoint`` with ``prevent_cse=False`` (``maxtext_utils.should_prevent_cse_in_remat``: a
scan keeps the recomputation apart from the forward by itself).  A stack whose scan runs once —
one scanned layer, or one block of layers (GPT-OSS scans blocks of two, so a 2-layer cut is one
trip; DeepSeek's ``dense_layers`` and ``moe_layers`` cut to one layer each) — is no loop in
XLA:TPU's program: its single trip is inlined, so the layer's forward, its recomputation and its
backward are one straight-line computation.  Read from XLA:TPU's (libtpu 0.0.52) buffer
assignment and live ranges of ``bench/maxtext_fidelity.py --dump-dir``'s gpt-oss-20b-v5p-full
(one block of two MoE layers, fsdp 4), deepseek2-16b-v5p-full (one dense and one MoE stack of one
layer each) and gpt-oss-20b-v6e-custom, and of the same gpt-oss-20b 2-layer step on v5p under
``remat_policy=custom`` with q/k/v offloaded:

* **The gathered experts are kept** (``kept_gather_bytes``, added to ``loss_bytes``: the layer
  phase counts a layer's gathered weights already).  The routed experts' kernels
  (``wi_0``, ``wi_1``, ``wo``: the stacks whose logical axes name ``exp`` and that the layer
  all-gathers over FSDP) are all-gathered in the compute dtype in the layer's forward and the
  backward reads those same buffers: no gather of them in the backward, live from the forward
  through the loss into the layer's backward (``bf16[32, 1, 2880, 2880]`` × 3 per layer in
  gpt-oss, ``bf16[64, 1, 2048, 1408]`` × 3 in deepseek2).  Which layers: under
  ``remat_policy=full`` (no name saved or offloaded; the recomputed layer is the forward again)
  every routed-expert layer of the single trip (both of gpt-oss's block: 6 × 517.5 MiB at its
  loss); under a policy that saves or offloads names (the custom q/k/v offload, on v5p and v6e)
  only the last routed-expert layer before the loss — the earlier layer keeps its converted shards
  and gathers them again in the backward, as a loop does.  Per device: the layer's slice gathered
  over the FSDP axes (its ``E / expert`` local experts), in the compute dtype.
* **Their shards are not copied** (``uncopied_stack_bytes``).  The cost model's TPU stack copies
  (:func:`tierax.costmodel.fixed._tpu_stack_copy_bytes`: every stacked weight's shard converted to
  the compute dtype before the forward loop and held to the backward's end) are, for a kept
  layer's experts, converted just before the gather and dead after it (live for 1 to 16
  instructions): their shard in the compute dtype is left out of the copies.
* **The stack's gradients are written after its layers' backward** (added to ``late_grad_bytes``).
  The experts' weight gradients (megablox's ``tgmm``) and the attention weights' gradient
  reduction run after the data gradient of every layer of the trip (gpt-oss under both policies,
  on v5p and v6e: after both layers' backward; deepseek2: after its MoE layer's): the layers'
  backward holds none of the stack's gradients (``grad_dtype``, its shard per device).  (A schedule
  choice at these sizes: the tiny block of ``tests/test_maxtext_tpu_moe.py`` makes two of its six
  expert gradients before the first layer's data gradient.)

* **One routed layer's experts at a time in the backward under a policy that saves names**
  (``gathered_expert_bytes``, the Program's: the layer workspace's gathered experts for the
  group).  Under such a policy the straight-line backward holds the last routed-expert layer's
  kept experts, frees them after that layer's backward and gathers each earlier layer's again for
  its own: never two layers' at once, where a loop's body gathers its whole scanned layer (a
  block: all of its routed layers).  Per device, the largest of the trip's routed layers' gathered
  slices in the compute dtype.  Read from gpt-oss-20b-v6e-custom (one block of two layers: the
  second layer's ``bf16[32, 1, 2880, 2880]`` × 3 live from the forward to its backward, the first
  layer's gathered again after they are freed), the same 2-layer step on v5p under the custom q/k/v
  offload, and llama4-17b-16e at 4 layers under a q/k/v offload (one block of four MoE layers,
  fsdp 4 × expert 2: one layer's ``bf16[8, 1, 5120, 8192]`` × 3 at a time in the backward, where
  the block's four layers' were priced).  Under ``full`` every routed layer's experts are kept into
  the backward (above): the block's all, as priced.

Not priced (seen, no rule): in the inlined program XLA also keeps some of the forward's values the
recomputation would make (gpt-oss-20b-v5p-full: 0.36 GiB of splash residuals and expert matmul
outputs at the loss, of the block's 0.79 GiB written residuals); under ``minimal`` XLA also
hoists one of the first layer's gathers over the loss; the optimizer's update after the
backward of a single-trip block (gpt-oss-20b-v6e-custom's top of live bytes is there: the
embedding table's float32 parameter and moments copied, the experts' bf16 gradients all-reduced
unsharded); and a layer-phase order between
two single-trip stacks (deepseek2's dense layer's backward runs after its MoE stack's gradients
are written: the layer phase, one for every group, counts the MoE stack's as late in both; the
dense layer's workspace is the smaller by more than them there).  A stack that loops (two trips or
more: mixtral-8x7b and qwen3-30b-a3b at 2 layers, gpt-oss-20b at 4 on v5p, whose compile the cost
model's looped reading follows) gathers its experts again in the backward loop and accumulates its
gradients in the loop: none of this applies
(:func:`single_trip_moe_groups` is empty).  XLA:TPU's temp is its assignment's highest offset; in
these inlined programs the assignment leaves gaps above the live set at the peak
(gpt-oss-20b-v5p-full 0.56 GiB, deepseek2-16b-v5p-full 0.37 GiB), which no rule here follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierax.interop.maxtext_program import weight_stacks


@dataclass(frozen=True)
class ExpertLayer:
    """One routed-expert layer of a stack's single trip: its expert kernels as one device holds
    them (elements of the gathered slice it computes with, of the shard it stores)."""

    group: str
    module: str  # the MoE module's path in MaxText's parameter tree
    gathered_elements: int
    shard_elements: int


@dataclass(frozen=True)
class TpuMoeTerms:
    """The Program fields :func:`tpu_moe_terms` fills, per device (module docstring)."""

    kept_gather_bytes: int
    uncopied_stack_bytes: int
    late_grad_bytes: int  # the single-trip routed-expert stacks' gradients
    # (group, bytes): one routed layer's gathered experts, under a policy that saves names
    gathered_expert_bytes: tuple[tuple[str, int], ...] = ()


def single_trip_moe_groups(inv, moe_groups, scan_layers: bool) -> list[str]:
    """The routed-expert groups of ``moe_groups`` whose scan runs a single trip (one scanned layer
    or block; module docstring) under MaxText's scanned remat (``scan_layers``: CSE not
    prevented; without it MaxText prevents CSE and none is kept)."""
    if not scan_layers:
        return []
    layers = {g.name: g.num_layers for g in inv.groups}
    return [g for g in moe_groups if layers.get(g) == 1]


def expert_layers(stacks, groups) -> list[ExpertLayer]:
    """The routed-expert layers of ``groups`` in MaxText's parameter tree order, from its stacked
    weights ``stacks`` (:func:`.weight_stacks.state_stacks`): the stacks whose logical axes name
    the experts' dimension and that a layer all-gathers over FSDP (the kernels, not the biases),
    grouped by their module (the path less the weight's name)."""
    out: dict[str, ExpertLayer] = {}
    for s in stacks:
        if s.group not in groups or not s.is_expert or not s.gathered_dims():
            continue
        module = s.path.rpartition("/")[0]
        layers = s.local_shape[s.layer_axis]
        shard = 1
        for n in s.local_shape:
            shard *= n
        prev = out.get(module, ExpertLayer(s.group, module, 0, 0))
        out[module] = ExpertLayer(
            s.group,
            module,
            prev.gathered_elements + s.gathered_layer_elements(),
            prev.shard_elements + shard // layers,
        )
    return list(out.values())


def kept_layers(layers: list[ExpertLayer], saves_nothing: bool, last_group: str) -> list:
    """The layers whose gathered experts XLA keeps from the forward into the backward (module
    docstring): all of them where the policy saves nothing, else the last routed-expert layer of
    the decoder's last stack (the one the loss follows) where it is among them."""
    if saves_nothing:
        return list(layers)
    last = [x for x in layers if x.group == last_group]
    return last[-1:]


def terms(
    layers: list[ExpertLayer],
    *,
    saves_nothing: bool,
    last_group: str,
    stack_params: dict[str, int],
    compute_itemsize: int,
    grad_itemsize: int,
) -> TpuMoeTerms:
    """:class:`TpuMoeTerms` of the single-trip stacks' routed-expert ``layers``; ``stack_params``:
    each single-trip group's parameters per device (its gradient's elements)."""
    kept = kept_layers(layers, saves_nothing, last_group)
    one_at_a_time = ()
    if not saves_nothing:
        groups = dict.fromkeys(x.group for x in layers)
        one_at_a_time = tuple(
            (g, compute_itemsize * max(x.gathered_elements for x in layers if x.group == g))
            for g in groups
        )
    return TpuMoeTerms(
        kept_gather_bytes=compute_itemsize * sum(x.gathered_elements for x in kept),
        uncopied_stack_bytes=compute_itemsize * sum(x.shard_elements for x in kept),
        late_grad_bytes=grad_itemsize * sum(stack_params.values()),
        gathered_expert_bytes=one_at_a_time,
    )


def tpu_moe_terms(config, inv, moe_groups, saves_nothing: bool) -> TpuMoeTerms:
    """MaxText's single-trip routed-expert terms on a TPU for ``config`` and its inventory ``inv``
    (``moe_groups``: its routed-expert groups; ``saves_nothing``: whether MaxText's remat policy
    saves or offloads no name), read from MaxText's abstract train state on the run's mesh; all 0
    where no routed-expert stack runs a single trip."""
    import jax.numpy as jnp

    single = single_trip_moe_groups(inv, moe_groups, bool(config.scan_layers))
    if not single:
        return TpuMoeTerms(0, 0, 0)
    from tierax.interop.maxtext_program.abstract_state import abstract_state

    stacks = weight_stacks.state_stacks(abstract_state(config), set(single))
    params = dict(inv.group_param_counts)
    return terms(
        expert_layers(stacks, set(single)),
        saves_nothing=saves_nothing,
        last_group=inv.groups[-1].name,
        stack_params={g: int(params.get(g, 0)) for g in single},
        compute_itemsize=jnp.dtype(config.dtype).itemsize,
        grad_itemsize=jnp.dtype(config.grad_dtype).itemsize,
    )
