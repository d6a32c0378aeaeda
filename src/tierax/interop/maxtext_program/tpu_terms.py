"""What MaxText's step holds on a TPU at its loss, during its layers' backward and after it, that
tierax's own step does not: the Program's ``loss_bytes``, ``after_backward_bytes`` and
``late_grad_bytes`` for a TPU target (:func:`tpu_terms`).

Read from XLA:TPU's buffer assignment and live ranges (libtpu 0.0.52, whose reported temp is its
own assignment's) of MaxText's compiles of the TPU cases of ``bench/maxtext_fidelity.py
--dump-dir``: llama3-8b-v5p-full (fsdp 4, 1 × 1024), llama3-8b-v7x-full (fsdp 8, 1 × 1024),
llama2-7b-v6e-full (fsdp 4, 2 × 1024, vocab 32000) and llama3-8b-v5p-full-tiled (4 tiles).  All
buffers are per device; ``c`` is the compute dtype's size, ``head`` = ``emb × vocab / tensor``,
``logits`` = ``tokens × vocab / tensor``, ``fsdp`` the ways the embedding and head are sharded.

* **The untiled loss** (``loss_bytes``): the head cast to the compute dtype and all-gathered
  (``c·head`` under FSDP), the logits in the compute dtype and the buffer the cross-entropy's
  backward writes from them, logits-sized in the compute dtype (``2·c·logits``; llama3-8b-v7x-full:
  both live at the fusion that writes the second; llama3-8b-v5p-full writes one, fused, and holds
  it: the rule's second is then an over-count of ``c·logits``).  No float32 ``[tokens, vocab]``
  buffer.  Where XLA makes the head's gradient at the loss (:func:`head_grad_schedule`, below) it
  makes it from the logits' gradient there: ``c·head`` live at the loss besides the gathered head
  and one logits-sized buffer, and its shard ``c·head / fsdp`` where it is reduce-scattered there
  (llama2-7b-v6e-full, mistral-7b-v6e-minimal; an all-reduce writes in place: llama3-8b at full
  depth).  Before that, the fusion that writes the logits' gradient reads the logits: two
  logits-sized buffers live together, the larger moment where the logits outgrow the head
  (``tokens > emb``, roughly: llama3-8b at its full depth, 4 × 8192 tokens on 8 v5p, where the
  logits live to the instruction that writes their gradient; a held-out case of
  ``bench/maxtext_fidelity.py`` until this was read from it).
* **Which side of the layers' backward the head's gradient is made on** (untied, untiled;
  :func:`head_grad_schedule`).  Read from where the optimized HLO schedules the head gradient's
  dot (``[tokens, emb]ᵀ × [tokens, vocab]``) against the layers' backward while loop, and from
  what the buffer assignment holds through the loop, in compiles on 8 devices (fsdp 8) under the
  flags ``simulate --maxtext`` models: ``bench/maxtext_fidelity.py``'s qwen3-8b-v6e-full-36L-8k,
  mistral-7b-v5p-custom-32L-8k, llama3-8b-v5p-full-32L-8k and llama2-7b-v7x-minimal-32L-8k, and
  2- and 3-layer cuts of qwen3-8b, mistral-7b, llama2-7b and llama3-8b on v5p, v6e and TPU7x,
  whose sides ``bench/investigations/head_grad_side.py`` reads again from their schedules: its
  record, ``bench/results/head_grad_side.json``, holds each cut's keys and shapes, XLA's side and
  this rule's (not what the loop holds).  Three schedules:

  - *after the loop*: the logits' gradient (``c·logits``) held through the loop, the head's
    gradient made from it after the loop and all-reduced (qwen3-8b v6e 1 × 8192, mistral-7b's
    offload);
  - *at the loss*: the gradient made before the loop and held unsharded through it (``c·head``),
    all-reduced at the loss (v5p, v6e) or reduce-scattered after the loop (TPU7x);
  - on v6e, *reduce-scattered at the loss*: one all-reduce-scatter fusion makes the shard at the
    loss where it is small, the shard held (``c·head / fsdp``).  How small depends on the decoder:
    with query and key norms (``use_qk_norm``: qwen3-8b) bf16 ``[512, 32000]`` and ``[512,
    64000]`` fused, ``[512, 128256]`` and up not (:data:`V6E_SCATTER_FUSION_BYTES`); without them
    (llama3-8b, llama2-7b, mistral-7b; qwen3-8b with ``use_qk_norm=false``) ``[512, 128256]``
    fused, ``[512, 151936]`` not (:data:`V6E_SCATTER_FUSION_BYTES_WITHOUT_QK_NORM`).

  Which side: after, wherever the step offloads a name to the host (mistral-7b at 2 × 8192 on v5p,
  ``custom`` with q, k and v offloaded, at 3 and 32 layers; the same step under ``full`` makes it
  at the loss); else at the loss where the tokens per device reach ``k`` times ``emb``, ``k`` per
  generation (:data:`HEAD_GRAD_AT_LOSS_TOKENS_PER_EMB`: v5p 1, v6e 3, TPU7x 2; on v5p read at
  vocabularies 32000, 128256 and 151936 and at ``emb`` 2048 and 4096 — emb 2048 at 2048 tokens
  at the loss, emb 4096 at 2048 after —, on v6e and TPU7x at emb 4096, the v6e boundary at
  vocabulary 151936).  It is not the schedule of the fewer bytes: on v6e
  at ``tokens = 2·emb`` XLA holds the logits' gradient, twice the head's.  Why the threshold
  differs by generation was not read.  The 1 × 1024 cuts (emb 2048 to 4096) all make it after the
  loop: qwen3-30b-a3b and deepseek2-16b (emb 2048, ``tokens = emb / 2``) on v5p, whose loss then
  holds two logits-sized buffers and no head-sized gradient (deepseek2-16b at 2 layers, dumped).
  Checked on a step it was not read from, the slow test's small untied step on 4 v5p (emb 1536,
  vocabulary 32768): after the loop at 1 × 1024 tokens, at the loss at 2 × 1024, where XLA holds
  the gradient's reduce-scattered shard through the loop, not the gradient (which shard size or
  mesh makes v5p reduce-scatter at the loss is not read: the rule over-counts the difference).
  On v6e the side follows the decoder as well as the head's shapes: at 1 × 8192 tokens (``tokens
  = 2·emb``) and vocabulary 128256, llama3-8b (its 2-layer cut, and its full-depth row, held out
  until this was read from its buffer assignment) makes the head's gradient at the loss and
  reduce-scatters it there, one fusion, into a bf16 ``[512, 128256]`` shard held through the
  layers' backward (no logits-sized buffer held), where qwen3-8b cut to 2 layers makes it after
  the loop.  Of the decoders' differences, cuts that change one at a time (the record's) read
  the query and key norms as deciding: qwen3-8b with ``use_qk_norm=false`` reduce-scatters at the
  loss as llama3-8b does, qwen3-8b with llama3-8b's ``mlp_dim`` (14336) and llama3-8b with
  qwen3-8b's (12288) keep their own sides.  Without the norms qwen3-8b's cut at its own
  vocabulary (151936) makes the gradient at the loss and holds it unsharded, at 8192 and 12288
  tokens: :data:`V6E_AT_LOSS_TOKENS_PER_EMB_WITHOUT_QK_NORM` (2; with the norms 8192 tokens make it
  after the loop).  Why the norms move XLA's choice was not read; the rule reads ``use_qk_norm``
  from MaxText's config, which the decoders that normalise queries and keys by that key (qwen3,
  olmo3, llama4) follow (a decoder that normalises them whatever the key, Gemma 3's, ties its
  head: the tied rule applies).  Missed (the record's rows): qwen3-8b's cut on v6e, with the
  norms, with one sequence of 12288 or 16384 tokens a device makes it after the loop, where the
  same tokens as 3 × 4096 or 2 × 8192 make it at the loss, as the rule says: on v6e the side
  follows the sequence length too (which property decides was not read).
  Not read: an untied head on v5e (the rule of the tied heads below applies), compiles without
  the modelled flags (the seen rows' reduce-scatter at the loss, llama2-7b and mistral-7b on v6e,
  follows the v6e fusion).
* **The layers' backward** (``late_grad_bytes``): XLA:TPU writes the embedding's and head's
  gradients (``grad_dtype``) after the layer loop, so the loop holds neither (the cost model's layer
  phase counts the state less ``late_grad_bytes``); it does hold what the head's gradient is made
  from after the loop, the logits-sized buffer ``c·logits`` (llama3-8b-v5p-full,
  llama3-8b-v7x-full), or, where the head's gradient was made at the loss, the gradient (``c·head``)
  or its reduce-scattered shard ``c·head / fsdp`` (llama2-7b-v6e-full). ``late_grad_bytes`` is the
  late gradients less that held buffer (the net the layer phase leaves out of the state; negative
  where the held buffer is the larger).  A tiled loss reduces the head's gradient into its float32
  shard in the tile loop (held through the layers' backward, with the head's shard cast to the
  compute dtype, ``c·head / fsdp``; llama3-8b-v5p-full-tiled): only the embedding's gradient is
  late.
* **After the layers' backward** (``after_backward_bytes``, untiled): the parameters and optimizer
  state, every layer's gradient (``grad_dtype``, sharded), the head's gradient in the compute dtype,
  unsharded (its all-reduce in place: llama3-8b-v5p-full), the embedding's gradient scatter-added
  in the compute dtype into its shard (``c·head / fsdp``; XLA schedules it before the head's
  gradient in llama3-8b-v5p-full and -v7x-full, after it in qwen3-8b-v6e-full: the rule counts it
  with the head's gradient), and the larger of the logits-sized buffer the head's gradient is read
  from (live until it is written) and the gradient's reduce-scatter output (a ``c·head / fsdp``
  shard; llama3-8b-v7x-full).  Where the head's gradient was made at the loss: the state, the layer
  gradients, the head's gradient reduced in place and the embedding's shard, or, reduce-scattered
  at the loss, the two shards.
* **The layer loop's stack copies under the head's gradient** (``after_backward_bytes``, untiled,
  the head's gradient made after the loop): XLA:TPU casts every looping stack's weight shards to
  the compute dtype before the forward loop and holds the copies to the end of the backward loop
  (:func:`tierax.costmodel.fixed._tpu_stack_copy_bytes`).  When the loop ends their slots are
  free, but they lie among buffers that stay live — the layers' float32 gradients written during
  the loop, the logits-sized buffer held from the loss — which bound the free runs they leave.
  Where the head's unsharded gradient (``c·head``) is larger than all the copies together
  (:func:`stack_copy_bytes`), no run they leave holds it (in every dump below no free run does)
  and XLA places it above them: the phase counts the copies' bytes as well
  (:func:`copies_under_head_grad`).  Read from the
  after-backward buffer assignments (libtpu 0.0.52) of llama3-8b-v5p-full and -minimal,
  llama3-8b-v5p-qkv-offloaded at 8 layers, llama3-8b-v7x-full, qwen3-8b-v6e-full, gemma3-4b at 12
  layers (v5p full, v6e minimal) and the slow test's small step: every copy's slot (but the norm
  scales') lies below the head's gradient as it is written, each free run under XLA's top smaller
  than the gradient; in the 8-layer case XLA puts some after-loop buffers into the copies' slots.
  At 2 layers under host offload XLA:TPU unrolls the loop (:mod:`.tpu_offload`): no copies are
  held, the gradient takes the gathered head's slot; the rule prices the looped program there, as
  the cost model does.  Where the copies are the larger
  (mixtral-8x7b-v5p-full, gpt-oss-20b at 4 layers) XLA puts the head's gradient into a free run
  low in its heap, as the condition reads.  Not explained: the other free runs under XLA's top —
  the saved activations' stacks freed at the loop's end (llama3-8b-v5p-minimal), other buffers
  freed beside the copies (qwen3-8b-v6e-full), a free run and buffers above the head's gradient
  (llama3-8b-v7x-full: the copies are about a third of its free runs), the gathered table's slot
  at the loss, which the loop's float32 gradients split (gemma3-4b at 12 layers: its largest
  run; at v5p full the cost model's layer phase stays the larger).  Over-counted where XLA
  writes the embedding's gradient shard after the head's gradient, into the run the copies and
  the logits-sized buffer leave (llama3-8b-v5p-qkv-offloaded at 3 layers): the rule counts both.
  A stack whose scan runs a single trip is no loop (:mod:`.tpu_moe`) and is not counted (gemma3-4b
  at 2 layers: one unscanned remainder block; gpt-oss-20b at 2 layers).
* **The tiled loss** (``num_vocab_tiling`` > 1): at the peak in the tile loop's backward one
  ``[emb, vocab]`` in the compute dtype at a time (the gathered head; the tile's head gradient
  reuses its slot and is all-reduced in place), the head gradient's accumulator shard
  (``grad_dtype``), the head's shard cast to the compute dtype, and one tile's logits in the
  compute dtype (llama3-8b-v5p-full-tiled).

* **A tied head** (``logits_via_embedding``: the logits are the embedding table read transposed;
  gemma, gemma2/3/4, gpt3, the small qwen3 and qwen2.5 models set it): one table, ``[vocab, emb]``
  sharded over fsdp on ``emb``, so the state's late gradients are that one table's
  (:func:`late_grad_params` reads them from the traced state).  Its bf16 shard (``c·head / fsdp``)
  is cast once before the layers' forward, read by the embedding lookup and held until the loss
  all-gathers it.  Read from gemma3-4b-v5p-full and gemma3-4b-v6e-minimal (emb 2560 > 2 × 1024
  tokens) and from MaxText's compile of a small tied step (4 v5p, emb 1536, vocab 32768, 2 layers,
  512 and 1024 tokens; ``tests/test_maxtext_tpu_terms.py``).  Where ``emb > 2·tokens``: the untied
  rules' buffers — the gathered bf16 table, one fused logits-sized bf16 buffer written at the loss
  and held through the layers' backward, the head's bf16 gradient ``[vocab, emb]`` made from it
  after the loop, unsharded and all-reduced in place, the embedding's gradient scatter-added into
  its bf16 shard just before (in both gemma3 dumps XLA's bytes in use as the head's gradient is
  written are the rule's ``after_backward_bytes`` less the arguments, as in a compile of gemma3-4b
  at 2 × 1024 tokens, where XLA keeps the same schedule).  Where XLA makes the head's gradient at
  the loss instead (the small step at 1024 tokens) it does not reduce-scatter it there: the table's
  gradient is the head's plus the embedding's, which exists only after the layers' backward, so the
  head's bf16 gradient is held unsharded through the layers' backward (``c·head``, the held buffer)
  and all-reduced after the loop beside the embedding's scattered shard (``after_backward_bytes``:
  the state, ``c·head`` and the shard); at the loss the gathered table and two logits-sized buffers,
  or one with the head's gradient where that is the larger.  Which schedule applies is
  :func:`head_grad_schedule`'s reading for a tied head (``emb ≤ 2·tokens``), taken from the untied
  heads' 1024-token compiles before their reading above, and not XLA's everywhere: gemma3-4b at 2 ×
  1024 tokens (tied) keeps the logits-sized buffer through the loop though ``emb ≤ 2·tokens``, as do
  the small step untied at 1024 tokens and the untied qwen3-30b-a3b and deepseek2-16b cases (emb
  2048, 1024 tokens), which the untied reading above now follows.  A tied head's loss bytes are the
  same under both schedules where the gathered table and two logits-sized buffers are the larger, so
  a peak at the loss does not depend on the reading.

* **A tied table gathered before the layers' forward** (``loss_bytes``, :func:`tpu_loss_bytes`'s
  ``early_gather``; :func:`table_gathered_before_forward`).  XLA:TPU on v5e compiles all-gathers
  as asynchronous collective fusions (a start and a done, the gather run in pieces between them)
  that may span a while loop, and a layer's FSDP-gathered matmuls as collective matmuls (the
  gather decomposed into a ring of collective-permutes under chunks of the matmul) where that is
  the faster; on v5p, v6e and TPU7x every all-gather of the compiles read is synchronous, at its
  use.  Where the forward loop's gathers are all collective matmuls — no synchronous collective
  left in the loop — v5e's gather of a tied table is such a fusion, started right after the
  table's shard is cast for the embedding lookup, before the layers' forward loop, and done after
  it: the gathered table (``c·head``) is live through the whole forward and held to the loss.  Its
  slot lies above every buffer the forward holds beside it, and the loss's logits-sized buffer
  and the head's gradient are placed above it in turn, under either schedule of the head's
  gradient (made at the loss, the table still live: the table, the logits-sized buffer and the
  gradient live together; made after the layers' backward: on top of the logits-sized buffer held
  through it).  XLA's top is then the forward's buffers under the table
  (:func:`forward_in_flight_bytes`: the stack copies and kept activations, which the cost model's
  loss phase counts already, the table's bf16 shard — the gather's operand, whose slot the
  gather's pieces reuse through the loop — and the layer in flight, its written residuals) plus
  the gathered table, one logits-sized buffer and the head's gradient.  XLA chooses a collective
  matmul where its cost model finds it the faster, which grows with the tokens per device (a ring
  step's matmul against moving its weight shard); the compiles read bracket it
  (:data:`COLLECTIVE_MATMUL_TOKENS`, the fewest tokens read with).  Read from the buffer
  assignments of bench/maxtext_fidelity.py's held-out gemma2-2b-v5e rows (2 × 1024 tokens:
  save-all, full and the q/k/v offload at 3 layers, a looping scan; at 2 layers under the offload
  XLA unrolls the loop and starts the gather in its second layer) and checked against the small
  tied step of ``tests/test_maxtext_tpu_terms.py`` on 4 v5e: at 512 tokens (emb 1536 or 1152,
  vocabulary 32768 or 256128) and at 1 × 1024 (emb 1536) the forward loop keeps synchronous
  all-gathers and the table is gathered after it, at the loss; at 2 × 1024 tokens the loop's
  gathers are collective matmuls and the table's gather spans the loop, but XLA places the table
  lowest there, under the forward's buffers: the rule's bytes under the table over-count that
  step (which programs get the table above the forward's buffers is not read).  Not read: an
  untied head on v5e at such sizes (the small step's untied head at 512 tokens is gathered after
  the loop), a tiled loss.  Gemma 3 (v5p and v6e) gathers its table at the loss.

Not traced: a loss without FSDP (no gathered head, no reduce-scatter: the rules' shards are then
the whole ``c·head``, an upper reading), tensor parallelism over the vocabulary, a tiled loss's
head read from the embedding (``logits_via_embedding`` with ``num_vocab_tiling`` > 1).

XLA:TPU's temp is its assignment's highest offset; the rules count the buffers live together, so
where the assignment leaves gaps below a phase's buffers (offsets free at that time, taken at
others) XLA's temp exceeds the rules' bytes by the gaps (``bench/maxtext_fidelity.py``'s rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from tierax.interop.maxtext_program.config import embedding_shards

# Per TPU generation whose all-gathers XLA:TPU (libtpu 0.0.52) compiles as asynchronous collective
# fusions that may span a while loop (v5e's; v5p's, v6e's and TPU7x's are synchronous in every
# compile read): the fewest tokens per device at which its forward loop's FSDP gathers were read
# as collective matmuls (module docstring: 2 × 1024 read with, 1 × 1024 and 512 without).
COLLECTIVE_MATMUL_TOKENS = {"v5e": 2048}

# Per TPU generation, the fewest tokens per device per embedding feature (tokens ÷ emb) at which
# XLA:TPU (libtpu 0.0.52) was read making an untied head's gradient at the loss and holding it
# unsharded through the layers' backward (module docstring, "Which side of the layers' backward");
# below it, after the loop from the logits' gradient held through it.  The compiles read bracket it
# (bench/results/head_grad_side.json's cuts, with bench/maxtext_fidelity.py's full-depth rows).
HEAD_GRAD_AT_LOSS_TOKENS_PER_EMB = {"v5p": 1, "v6e": 3, "tpu7x": 2}
# On v6e XLA:TPU fuses the head's gradient with its reduce-scatter at the loss (an
# all-reduce-scatter fusion) where the reduce-scattered shard is no larger than this (module
# docstring), in a decoder with query and key norms (``use_qk_norm``): the largest shard read fused
# (bench/results/head_grad_side.json's qwen3-8b v6e cuts by vocabulary) ...
V6E_SCATTER_FUSION_BYTES = 2 * 512 * 64000
# ... and in one without them: the largest read fused there (llama3-8b's, and qwen3-8b's cut with
# the norms off, at vocabulary 128256; 151936 unfused).
V6E_SCATTER_FUSION_BYTES_WITHOUT_QK_NORM = 2 * 512 * 128256
# On v6e, in a decoder without query and key norms, the fewest tokens per embedding feature read
# with the head's gradient made at the loss (HEAD_GRAD_AT_LOSS_TOKENS_PER_EMB's v6e figure is read
# from decoders with them): qwen3-8b's cuts with the norms off at 8192 and 12288 tokens, emb 4096.
V6E_AT_LOSS_TOKENS_PER_EMB_WITHOUT_QK_NORM = 2


@dataclass(frozen=True)
class TpuTerms:
    """The Program fields :func:`tpu_terms` fills (:class:`tierax.tracing.program.Program`)."""

    loss_bytes: int
    after_backward_bytes: int
    late_grad_bytes: int


@dataclass(frozen=True)
class _Shapes:
    c: int  # the compute dtype's size
    g: int  # the gradients' dtype size
    head: int  # emb × vocab / tensor
    logits: int  # tokens × vocab / tensor
    fsdp: int
    emb: int
    tokens: int


def _shapes(config, inv) -> _Shapes:
    import jax.numpy as jnp

    tensor = int(inv.mesh.get("tensor", 1))
    vocab = int(config.vocab_size) // tensor
    tokens = int(inv.microbatch) * int(inv.seq)
    return _Shapes(
        c=jnp.dtype(config.dtype).itemsize,
        g=jnp.dtype(config.grad_dtype).itemsize,
        head=int(config.emb_dim) * vocab,
        logits=tokens * vocab,
        fsdp=embedding_shards(inv),
        emb=int(config.emb_dim),
        tokens=tokens,
    )


def tied_head(config) -> bool:
    """Whether MaxText reads the logits from the embedding table (``logits_via_embedding``)."""
    return bool(getattr(config, "logits_via_embedding", False))


def qk_norm(config) -> bool:
    """Whether MaxText's decoder normalises its queries and keys (``use_qk_norm``; a config that
    does not carry the key: no)."""
    return bool(getattr(config, "use_qk_norm", False))


AFTER, AT_LOSS, SCATTERED_AT_LOSS = "after", "at the loss", "reduce-scattered at the loss"


def head_grad_schedule(config, inv, target: str | None = None, offloads: bool = False) -> str:
    """Where XLA:TPU makes the head's gradient (module docstring, "Which side of the layers'
    backward"): :data:`AFTER` the layers' backward loop (the logits' gradient held through it),
    :data:`AT_LOSS` (the gradient held unsharded through the loop) or
    :data:`SCATTERED_AT_LOSS` (made and reduce-scattered at the loss, its shard held).

    A tied head, a generation no compile was read on, or ``target`` None: at the loss where the
    gradient is no larger than the logits and the buffer written from them (``emb ≤ 2 · tokens``;
    a tied head then holds it unsharded, an untied one its shard).  An untied head on a read
    generation: on v6e reduce-scattered at the loss where its shard fits the fusion (read at
    ``emb ≤ 2 · tokens``; :data:`V6E_SCATTER_FUSION_BYTES` in a decoder with query and key norms,
    :func:`qk_norm`, :data:`V6E_SCATTER_FUSION_BYTES_WITHOUT_QK_NORM` without); else after the
    loop where the step offloads to the host (``offloads``), at the loss where ``tokens ≥ k ·
    emb`` (:data:`HEAD_GRAD_AT_LOSS_TOKENS_PER_EMB`; on v6e without the norms
    :data:`V6E_AT_LOSS_TOKENS_PER_EMB_WITHOUT_QK_NORM`), after the loop below it."""
    from tierax import hardware

    s = _shapes(config, inv)
    old = s.emb <= 2 * s.tokens
    generation = getattr(hardware.get_target(target), "generation", "") if target else ""
    k = HEAD_GRAD_AT_LOSS_TOKENS_PER_EMB.get(generation)
    if tied_head(config) or k is None:
        if not old:
            return AFTER
        return AT_LOSS if tied_head(config) else SCATTERED_AT_LOSS
    if generation == "v6e":
        norms = qk_norm(config)
        fused = V6E_SCATTER_FUSION_BYTES if norms else V6E_SCATTER_FUSION_BYTES_WITHOUT_QK_NORM
        if old and s.c * s.head // s.fsdp <= fused:
            return SCATTERED_AT_LOSS
        k = k if norms else V6E_AT_LOSS_TOKENS_PER_EMB_WITHOUT_QK_NORM
    if offloads or s.tokens < k * s.emb:
        return AFTER
    return AT_LOSS


def head_grad_at_loss(config, inv, target: str | None = None, offloads: bool = False) -> bool:
    """Whether XLA:TPU makes the head's gradient at the loss (:func:`head_grad_schedule`)."""
    return head_grad_schedule(config, inv, target, offloads) != AFTER


def forward_in_flight_bytes(config, inv) -> int:
    """What the layers' forward loop holds beside the stack copies and kept activations where the
    table's gather is started before it (module docstring): the table's shard in the compute
    dtype (``c·head / fsdp``, the gather's operand, whose slot the gather's pieces take in the
    loop) and one layer's written residuals (the largest group's)."""
    s = _shapes(config, inv)
    written = max((int(g.written_residual_bytes_per_layer) for g in inv.groups), default=0)
    return int(s.c * s.head // s.fsdp + written)


def table_gathered_before_forward(config, inv, target: str) -> bool:
    """Whether XLA:TPU starts the tied table's all-gather before the layers' forward loop and holds
    it to the loss (module docstring): a tied head, untiled, gathered over FSDP, on a target whose
    all-gathers XLA:TPU makes asynchronous collective fusions that may span a while loop, at tokens
    per device where its forward loop's gathers run as collective matmuls (no synchronous
    collective left in the loop: :data:`COLLECTIVE_MATMUL_TOKENS`)."""
    from tierax import hardware

    s = _shapes(config, inv)
    least = COLLECTIVE_MATMUL_TOKENS.get(getattr(hardware.get_target(target), "generation", ""))
    return (
        least is not None
        and tied_head(config)
        and int(config.num_vocab_tiling) == 1
        and s.fsdp > 1
        and s.tokens >= least
    )


def tpu_loss_bytes(
    config, inv, early_gather: bool = False, target: str | None = None, offloads: bool = False
) -> int:
    """The bytes MaxText's loss holds on a TPU beside the parameters, optimizer state and kept
    activations (module docstring); ``early_gather``: the table's gather is started before the
    layers' forward loop (:func:`table_gathered_before_forward`); ``target`` and ``offloads``:
    :func:`head_grad_schedule`'s."""
    s = _shapes(config, inv)
    schedule = head_grad_schedule(config, inv, target, offloads)
    gathered = s.c * s.head if s.fsdp > 1 else 0
    if early_gather:
        # the table's slot above the forward's buffers, the logits-sized buffer and the head's
        # gradient above it, under either schedule of the head's gradient
        return int(forward_in_flight_bytes(config, inv) + gathered + s.c * s.logits + s.c * s.head)
    if int(config.num_vocab_tiling) > 1:
        tiles = int(config.num_vocab_tiling)
        return int(s.c * s.head + (s.g + s.c) * s.head // s.fsdp + s.c * s.logits // tiles)
    if schedule == AT_LOSS and tied_head(config):
        # not reduce-scattered at the loss: the gathered table and two logits-sized buffers, then
        # one of them with the head's unsharded gradient once the gathered table is freed
        return int(max(gathered + 2 * s.c * s.logits, s.c * s.logits + s.c * s.head))
    if schedule != AFTER:
        # the fusion that writes the logits' gradient reads the logits (both live), before the
        # head's gradient (and, reduce-scattered there, its shard) is made from the gradient; an
        # all-reduce at the loss writes in place (module docstring)
        shard = s.c * s.head // s.fsdp if schedule == SCATTERED_AT_LOSS else 0
        made = s.c * s.logits + s.c * s.head + shard
        return int(gathered + max(2 * s.c * s.logits, made))
    return int(gathered + 2 * s.c * s.logits)


def held_in_layer_backward(config, inv, target: str | None = None, offloads: bool = False) -> int:
    """The buffer of the loss XLA:TPU holds through the layers' backward: untiled, the logits-sized
    buffer the head's gradient is made from after the loop, or where it was made at the loss the
    gradient itself, unsharded, or where it was reduce-scattered there its shard
    (:func:`head_grad_schedule`); tiled, the head's shard cast to the compute dtype (the
    accumulator's float32 shard is the state's gradient)."""
    s = _shapes(config, inv)
    if int(config.num_vocab_tiling) > 1:
        return int(s.c * s.head // s.fsdp)
    schedule = head_grad_schedule(config, inv, target, offloads)
    if schedule == AT_LOSS:
        return int(s.c * s.head)
    if schedule == SCATTERED_AT_LOSS:
        return int(s.c * s.head // s.fsdp)
    return int(s.c * s.logits)


def late_grad_params(config, inv) -> int:
    """The parameters whose gradients XLA:TPU writes after the layers' backward, per device: the
    embedding's and head's (every parameter outside the layer stacks) untiled; tiled, those less
    the head's shard, which the tile loop accumulates."""
    layers = int(sum(n for _, n in inv.group_param_counts))
    outside = int(inv.grad_bytes // _shapes(config, inv).g) - layers
    if int(config.num_vocab_tiling) > 1 and not tied_head(config):
        s = _shapes(config, inv)
        outside -= s.head // s.fsdp
    return outside


def tpu_late_grad_bytes(config, inv, target: str | None = None, offloads: bool = False) -> int:
    """The state's bytes the cost model's layer phase leaves out on a TPU: the late gradients
    (:func:`late_grad_params`, ``grad_dtype``) less the loss's buffer held through the layers'
    backward (:func:`held_in_layer_backward`)."""
    s = _shapes(config, inv)
    held = held_in_layer_backward(config, inv, target, offloads)
    return int(s.g * late_grad_params(config, inv) - held)


def stack_copy_bytes(config, inv) -> int:
    """The looping stacks' weight shards in the compute dtype, per device (module docstring): every
    layer group whose scan runs two trips or more, at its traced parameters per device."""
    s = _shapes(config, inv)
    counts = dict(inv.group_param_counts)
    return int(s.c * sum(counts.get(g.name, 0) for g in inv.groups if g.num_layers > 1))


def copies_under_head_grad(config, inv) -> int:
    """The stack copies' bytes XLA:TPU's after-backward top holds under the head's gradient where
    that is made after the layer loop (module docstring; :func:`tpu_after_backward_bytes`' untiled
    branch without :func:`head_grad_at_loss`): :func:`stack_copy_bytes` where the head's unsharded
    gradient is larger than the copies together, else 0."""
    s = _shapes(config, inv)
    copies = stack_copy_bytes(config, inv)
    return copies if s.c * s.head > copies else 0


def tpu_after_backward_bytes(config, inv, target: str | None = None, offloads: bool = False) -> int:
    """All device bytes of MaxText's step on a TPU after the layers' backward (untiled; module
    docstring); 0 for a tiled loss (no such phase)."""
    s = _shapes(config, inv)
    if int(config.num_vocab_tiling) > 1:
        return 0
    layers = int(sum(n for _, n in inv.group_param_counts))
    state = int(inv.param_bytes + inv.optimizer_bytes + s.g * layers)
    shard = s.c * s.head // s.fsdp
    schedule = head_grad_schedule(config, inv, target, offloads)
    if schedule == AT_LOSS:
        # the head's gradient held from the loss, reduced in place, and the embedding's shard
        return int(state + s.c * s.head + shard)
    if schedule == SCATTERED_AT_LOSS:
        return int(state + 2 * shard)
    head_grad = s.c * s.head + shard + max(s.c * s.logits, shard)
    return int(state + head_grad + copies_under_head_grad(config, inv))


def tpu_terms(config, inv, target: str | None = None, offloads: bool = False) -> TpuTerms:
    """MaxText's TPU terms for ``config`` and its inventory ``inv`` on ``target`` (module
    docstring; None: a target whose gathers are synchronous and no generation's reading of the
    head's gradient); ``offloads``: the step offloads a name to the host."""
    early = target is not None and table_gathered_before_forward(config, inv, target)
    return TpuTerms(
        loss_bytes=tpu_loss_bytes(config, inv, early, target, offloads),
        after_backward_bytes=tpu_after_backward_bytes(config, inv, target, offloads),
        late_grad_bytes=tpu_late_grad_bytes(config, inv, target, offloads),
    )
