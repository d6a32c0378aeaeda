"""Expert-parallel mixture of experts: route, dispatch with all-to-all, local batched GEMMs,
combine.

The routed-expert computation of :class:`tierax.models.layers.MoE`:

1. **Route** (every device, its own tokens): sigmoid (DeepSeek-V3 §2.1.2) or softmax
   (Mixtral §2.1) affinities, top-k, gates renormalised over the chosen experts.
2. **Dispatch** (``jax.shard_map`` over the whole mesh): each device sorts its local
   (token, choice) assignments by expert and writes them into a capacity-padded
   send buffer ``[experts, C_local, D]`` (``C_local = cfg.capacity(local tokens)``;
   assignments past it are dropped); ``all_to_all`` over ``expert`` sends each
   expert shard its experts' rows, so a device holds
   ``[local experts, expert_shards × C_local, D]``.
3. **Expert MLP** (GSPMD, outside the shard_map so the checkpoint names
   ``moe_mlpwi_0``/``moe_mlpwi_1``/``moe_mlpwo`` are seen by the layer's remat
   policy): batched GEMMs over the local experts, the expert weights gathered over
   ``fsdp`` (FSDP), their hidden dimension split over ``tensor`` (the down-projection
   all-reduced over ``tensor``).  Memory and FLOPs ∝ routed tokens per device
   (times the capacity factor), not the global token count.
4. **Combine** (``shard_map``): ``all_to_all`` back, gather each assignment's row,
   weight by its gate, sum over the k choices.

Without a mesh (or on one device) the same functions run with one expert shard and
no collectives.

``moe_impl: ragged`` (TPU targets) is the dropless grouped-matmul form MaxText's TPU runs use
(megablox / ``jax.lax.ragged_dot``): each device sorts its (token, choice) assignments by expert
and runs the three expert GEMMs as ``ragged_dot`` over the sorted rows with one group per expert —
no capacity, nothing dropped, no padded slots — then un-sorts, weights by the gates and sums the k
choices.  It equals the capacity form wherever that drops nothing.  On a mesh it runs per device
under ``shard_map`` in MaxText's ring-of-experts form (:func:`_ragged_experts`: the tokens
all-gathered over ``expert``, each shard's own experts as grouped GEMMs on ``F / tensor`` of the
hidden dimension, the partial outputs summed over ``tensor`` and reduce-scattered back over
``expert``; on a data/fsdp mesh, each device's own tokens against the expert weights gathered
whole).  Its checkpoint names are in the layer body, between the ``shard_map`` calls, at the
per-device size.  It is not offered for GPU targets: XLA:GPU lowers ``ragged_dot``
to a masked dense GEMM (every row against every expert).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tierax import names as N
from tierax.errors import TieraxError
from tierax.mesh import BATCH_AXES, constrain, spec
from tierax.models import fp8 as fp8_lib
from tierax.models import mxfp8 as mxfp8_lib
from tierax.models.tags import tag

EXPERT_AXIS = "expert"
# The batch axes other than ``expert``: the received tokens' capacity dimension is split over them.
TOKEN_AXES = tuple(a for a in BATCH_AXES if a != EXPERT_AXIS)


def route(x_TD, router_DE, cfg):
    """(gates [T, k] float32, experts [T, k] int32) for tokens ``x_TD``: ``cfg.router_score``
    affinities (DeepSeek-V3's sigmoid, Mixtral's softmax), top-k, renormalised over the k."""
    logits_TE = jnp.dot(x_TD.astype(jnp.float32), router_DE.astype(jnp.float32))
    if cfg.router_score == "softmax":
        scores_TE = jax.nn.softmax(logits_TE, axis=-1)
    else:
        scores_TE = jax.nn.sigmoid(logits_TE)
    top_Tk, expert_Tk = jax.lax.top_k(scores_TE, cfg.num_experts_per_tok)
    gates_Tk = top_Tk / jnp.sum(top_Tk, axis=-1, keepdims=True) * cfg.routed_scaling_factor
    return gates_Tk, expert_Tk.astype(jnp.int32)


def _sort(expert_A, num_experts: int):
    """(order, counts per expert, first sorted position per expert) of a stable sort by expert."""
    order = jnp.argsort(expert_A, stable=True)
    counts_E = jnp.zeros((num_experts,), jnp.int32).at[expert_A].add(1)
    return order, counts_E, jnp.cumsum(counts_E) - counts_E


def slots(expert_A, num_experts: int):
    """Position of each assignment inside its expert's buffer, in assignment (token) order.

    A stable sort by expert: O(A log A), no [A, E] one-hot.
    """
    A = expert_A.shape[0]
    order, _, starts_E = _sort(expert_A, num_experts)
    slot_sorted = jnp.arange(A, dtype=jnp.int32) - starts_E[expert_A[order]]
    return jnp.zeros((A,), jnp.int32).at[order].set(slot_sorted)


def dropped_assignments(expert_Tk, num_experts: int, capacity: int):
    """How many (token, choice) assignments of ``expert_Tk`` overflow ``capacity`` slots per
    expert."""
    return jnp.sum(slots(expert_Tk.reshape(-1), num_experts) >= capacity)


def _dispatch_local(x_TD, expert_Tk, num_experts: int, capacity: int, dtype):
    """(buffer [E, C, D], slot of each assignment): each buffer row gathered from its token.

    The buffer is built by a gather (row (e, c) ← the token of expert e's c-th assignment,
    zero where expert e has fewer than c + 1), so nothing of size [T·k, D] exists; its
    gradient is a scatter-add into [T, D].  Assignments past ``capacity`` are dropped.
    """
    T, k = expert_Tk.shape
    A = T * k
    expert_A = expert_Tk.reshape(A)
    order, counts_E, starts_E = _sort(expert_A, num_experts)
    slot_A = (
        jnp.zeros((A,), jnp.int32)
        .at[order]
        .set(jnp.arange(A, dtype=jnp.int32) - starts_E[expert_A[order]])
    )
    c_C = jnp.arange(capacity, dtype=jnp.int32)
    pos_EC = jnp.minimum(starts_E[:, None] + c_C[None, :], A - 1)
    token_EC = jnp.where(c_C[None, :] < counts_E[:, None], order[pos_EC] // k, T)  # T: empty slot
    buf_ECD = x_TD.astype(dtype).at[token_EC].get(mode="fill", fill_value=0)
    return buf_ECD, slot_A


def _combine_local(y_ECD, expert_Tk, slot_A, gates_Tk):
    """Σ_j gate_j · y[expert_j, slot_j] per token, one [T, D] gather per choice (dropped: 0)."""
    T, k = expert_Tk.shape
    slot_Tk = slot_A.reshape(T, k)
    out_TD = None
    for j in range(k):
        y_TD = y_ECD.at[expert_Tk[:, j], slot_Tk[:, j]].get(mode="fill", fill_value=0)
        term = y_TD * gates_Tk[:, j : j + 1].astype(y_TD.dtype)
        out_TD = term if out_TD is None else out_TD + term
    return out_TD


def _expert_mlp(buf_ECD, wi_0, wi_1, wo, dtype, mesh, fp8_metas=None, mxfp8=False):
    """The local experts' SwiGLU on their received rows (tagged for the remat policy).

    ``fp8_metas``: weight name → its GEMM's delayed-scaling state (tierax.models.fp8) to run the
    three GEMMs in fp8; ``mxfp8``: run them block-scaled in MXFP8 (tierax.models.mxfp8); neither:
    in ``dtype``."""
    wi_0 = constrain(wi_0.astype(dtype), mesh, EXPERT_AXIS, None, "tensor")
    wi_1 = constrain(wi_1.astype(dtype), mesh, EXPERT_AXIS, None, "tensor")
    wo = constrain(wo.astype(dtype), mesh, EXPERT_AXIS, "tensor", None)

    def gemm(spec, x, w, name):
        if mxfp8:
            return mxfp8_lib.einsum(spec, x, w, dtype)
        if fp8_metas is None:
            return jnp.einsum(spec, x, w)
        return fp8_lib.einsum(spec, x, w, fp8_metas[name], dtype)

    h0_ECF = gemm("ecd,edf->ecf", buf_ECD, wi_0, "wi_0")
    h0_ECF = tag(constrain(h0_ECF, mesh, EXPERT_AXIS, TOKEN_AXES, "tensor"), N.MOE_MLPWI_0)
    h1_ECF = gemm("ecd,edf->ecf", buf_ECD, wi_1, "wi_1")
    h1_ECF = tag(constrain(h1_ECF, mesh, EXPERT_AXIS, TOKEN_AXES, "tensor"), N.MOE_MLPWI_1)
    y_ECD = gemm("ecf,efd->ecd", jax.nn.silu(h0_ECF) * h1_ECF, wo, "wo")
    return tag(constrain(y_ECD, mesh, EXPERT_AXIS, TOKEN_AXES, None), N.MOE_MLPWO)


def _ragged_dispatch(x_TD, expert_Tk, gates_Tk, num_experts: int, dtype, ep: int, shard):
    """One device's side of the ring-of-experts dispatch: (the sorted rows ``[R, D]``, the group
    size of each of the shard's ``E / ep`` experts, the sort order of the group's ``G·k``
    assignments, the gates ``[G, k]`` of the expert group's ``G = ep·T`` tokens).

    All-gather the tokens, their experts and gates over ``expert`` (``ep`` > 1); sort the
    assignments with shard ``shard``'s experts first (in expert order, the rest after) and keep the
    first ``R = G·min(E/ep, k)`` sorted rows: a token chooses k distinct experts, so no more of its
    assignments are the shard's and the buffer holds every one — nothing dropped.  Without expert
    parallelism ``R = T·k``: every assignment."""
    T, k = expert_Tk.shape
    e_loc = num_experts // ep
    if ep > 1:
        gather = lambda a: jax.lax.all_gather(a, EXPERT_AXIS, axis=0, tiled=True)  # noqa: E731
        x_TD, expert_Tk, gates_Tk = gather(x_TD), gather(expert_Tk), gather(gates_Tk)
    G = ep * T
    local_A = expert_Tk.reshape(G * k) - shard * e_loc
    key_A = jnp.where((local_A >= 0) & (local_A < e_loc), local_A, e_loc)
    order = jnp.argsort(key_A, stable=True)
    sizes_e = jnp.zeros((e_loc + 1,), jnp.int32).at[key_A].add(1)[:e_loc]
    rows_R = order[: G * min(e_loc, k)]
    return x_TD.astype(dtype)[rows_R // k], sizes_e, order, gates_Tk


def _ragged_combine(y_RD, sizes_e, order, gates_Gk, ep: int, tp: int):
    """The dispatch's inverse on one device: each assignment's row gathered back from its sorted
    position (``ep`` > 1: 0 for another shard's, and rows past the shard's assignments never read),
    weighted by their gates and summed over the k choices (0 for another shard's experts), the
    partial outputs summed over ``tensor`` (``tp`` > 1: each device holds ``F / tp`` of the hidden
    dimension) and reduce-scattered over ``expert`` back to the tokens' shards (``ep`` > 1)."""
    G, k = gates_Gk.shape
    R = y_RD.shape[0]
    # Each assignment's sorted position (the inverse of the dispatch's sort order): a gather of
    # [A] rows.  (A scatter of the rows into [A, D] instead has XLA:TPU broadcast its indices to a
    # 4-byte [R, D] buffer, bench/results/ragged_ep_compile.json.)
    pos_A = jnp.zeros_like(order).at[order].set(jnp.arange(G * k, dtype=order.dtype))
    if ep > 1:  # another shard's assignment: R, out of range, reads 0
        pos_A = jnp.where(pos_A < jnp.sum(sizes_e), pos_A, R)
    pos_Gk = pos_A.reshape(G, k)
    out_GD = None
    for j in range(k):  # the capacity form's order of summation (_combine_local)
        # One choice's rows at a time, [G, D]: gathering all G·k assignments at once made XLA:TPU
        # write [G·k, D] buffers, most of whose rows are another shard's zeros under expert
        # parallelism (bench/results/ragged_ep_compile.json).
        y_GD = y_RD.at[pos_Gk[:, j]].get(mode="fill", fill_value=0)
        term = y_GD * gates_Gk[:, j : j + 1].astype(y_GD.dtype)
        out_GD = term if out_GD is None else out_GD + term
    if ep > 1:
        out_GD = jax.lax.psum_scatter(out_GD, EXPERT_AXIS, scatter_dimension=0, tiled=True)
    if tp > 1:
        out_GD = jax.lax.psum(out_GD, "tensor")
    return out_GD


def _ragged_experts(x_BSD, gates_BSk, expert_BSk, wi_0, wi_1, wo, cfg, mesh):
    """Dropless routed experts as grouped GEMMs (``ragged_dot``, one group per expert).

    On a mesh, MaxText's ring-of-experts form: a ``shard_map`` dispatch
    (:func:`_ragged_dispatch`), each GEMM a ``shard_map`` of its own on every device's rows and its
    shard's experts (weights: E over ``expert``, F over ``tensor``, gathered over ``fsdp``), a
    ``shard_map`` combine (:func:`_ragged_combine`).  The GEMMs' outputs are tagged between the
    ``shard_map`` calls, in the layer body, where the layer's remat policy and the prefetching
    scan's tape see them — at the per-device size of the ring's rows."""
    dt = jnp.dtype(cfg.dtype)
    B, S, D = x_BSD.shape
    k = expert_BSk.shape[-1]
    E = cfg.num_experts
    if mesh is None or mesh.size == 1:
        x_RD, sizes_e, order, gates_Gk = _ragged_dispatch(
            x_BSD.reshape(B * S, D),
            expert_BSk.reshape(-1, k),
            gates_BSk.reshape(-1, k),
            E,
            dt,
            1,
            0,
        )
        h0 = tag(jax.lax.ragged_dot(x_RD, wi_0.astype(dt), sizes_e), N.MOE_MLPWI_0)
        h1 = tag(jax.lax.ragged_dot(x_RD, wi_1.astype(dt), sizes_e), N.MOE_MLPWI_1)
        y_RD = tag(jax.lax.ragged_dot(jax.nn.silu(h0) * h1, wo.astype(dt), sizes_e), N.MOE_MLPWO)
        return _ragged_combine(y_RD, sizes_e, order, gates_Gk, 1, 1).reshape(B, S, D)

    ep, tp = mesh.shape[EXPERT_AXIS], mesh.shape["tensor"]
    P = jax.sharding.PartitionSpec
    batch = spec(mesh, BATCH_AXES)[0]
    ex = EXPERT_AXIS if ep > 1 else None
    tn = "tensor" if tp > 1 else None
    tok, rows, cols, per_shard = P(batch, None, None), P(batch), P(batch, None), P(batch, tn)

    def dispatch(x_bsd, expert_bsk, gates_bsk):
        t = x_bsd.shape[0] * S
        shard = jax.lax.axis_index(EXPERT_AXIS)
        return _ragged_dispatch(
            x_bsd.reshape(t, D), expert_bsk.reshape(t, k), gates_bsk.reshape(t, k), E, dt, ep, shard
        )

    def smap(fn, in_specs, out_specs):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)

    x_RD, sizes_e, order, gates_Gk = smap(dispatch, (tok, tok, tok), (cols, rows, rows, cols))(
        constrain(x_BSD, mesh, BATCH_AXES, None, None), expert_BSk, gates_BSk
    )
    gmm_in = smap(jax.lax.ragged_dot, (cols, P(ex, None, tn), rows), per_shard)
    h0 = tag(gmm_in(x_RD, wi_0.astype(dt), sizes_e), N.MOE_MLPWI_0)
    h1 = tag(gmm_in(x_RD, wi_1.astype(dt), sizes_e), N.MOE_MLPWI_1)
    # Partial sums over tensor: one [R, D] per tensor shard, stacked, summed in the combine.
    gmm_out = smap(
        lambda a, w, s: jax.lax.ragged_dot(a, w, s)[None],
        (per_shard, P(ex, tn, None), rows),
        P(tn, batch, None),
    )
    y = tag(gmm_out(jax.nn.silu(h0) * h1, wo.astype(dt), sizes_e), N.MOE_MLPWO)

    def combine(y_1RD, sizes_e, order, gates_Gk):
        out = _ragged_combine(y_1RD[0], sizes_e, order, gates_Gk, ep, tp)
        return out.reshape(-1, S, D)

    return smap(combine, (P(tn, batch, None), rows, rows, cols), tok)(y, sizes_e, order, gates_Gk)


def routed_experts(x_BSD, router_DE, wi_0, wi_1, wo, cfg, mesh=None, fp8_metas=None, mxfp8=False):
    """Output of the routed experts for ``x_BSD`` (the shared experts are not included).

    Args:
      x_BSD: the layer's normalised input, batch split over :data:`BATCH_AXES` on ``mesh``.
      router_DE, wi_0 [E, D, F], wi_1 [E, D, F], wo [E, F, D]: the MoE parameters.
      mesh: the :class:`jax.sharding.Mesh` the step runs on, or None (one device).
      fp8_metas: the expert GEMMs' fp8 state (:func:`_expert_mlp`); None: no fp8.
      mxfp8: the expert GEMMs in MXFP8 (:func:`_expert_mlp`).
    """
    dt = jnp.dtype(cfg.dtype)
    B, S, D = x_BSD.shape
    E = cfg.num_experts
    gates_BSk, expert_BSk = route(x_BSD.reshape(B * S, D), router_DE, cfg)
    k = expert_BSk.shape[-1]
    gates_BSk, expert_BSk = gates_BSk.reshape(B, S, k), expert_BSk.reshape(B, S, k)
    if getattr(cfg, "moe_impl", "capacity") == "ragged":
        return _ragged_experts(x_BSD, gates_BSk, expert_BSk, wi_0, wi_1, wo, cfg, mesh)

    if mesh is None or mesh.size == 1:
        T = B * S
        buf_ECD, slot_A = _dispatch_local(
            x_BSD.reshape(T, D), expert_BSk.reshape(T, k), E, cfg.capacity(T), dt
        )
        y_ECD = _expert_mlp(buf_ECD, wi_0, wi_1, wo, dt, None, fp8_metas, mxfp8)
        return _combine_local(
            y_ECD, expert_BSk.reshape(T, k), slot_A, gates_BSk.reshape(T, k)
        ).reshape(B, S, D)

    ep = mesh.shape[EXPERT_AXIS]
    e_loc = E // ep
    b_loc = B // (mesh.shape["data"] * mesh.shape["fsdp"] * ep)
    C = cfg.capacity(b_loc * S)
    batch = spec(mesh, BATCH_AXES)[0]
    tok_spec = jax.sharding.PartitionSpec(batch, None, None)
    slot_spec = jax.sharding.PartitionSpec(batch)
    buf_spec = spec(mesh, EXPERT_AXIS, TOKEN_AXES, None)

    def dispatch(x_bsd, expert_bsk):
        t = x_bsd.shape[0] * S
        buf_ECD, slot_A = _dispatch_local(x_bsd.reshape(t, D), expert_bsk.reshape(t, k), E, C, dt)
        if (
            ep > 1
        ):  # block j of the expert dimension goes to expert shard j; receive one block per source
            buf_ECD = jax.lax.all_to_all(buf_ECD, EXPERT_AXIS, 0, 0, tiled=True)
        # [source, local expert, C, D] → [local expert, source × C, D]
        buf = buf_ECD.reshape(ep, e_loc, C, D).transpose(1, 0, 2, 3).reshape(e_loc, ep * C, D)
        return buf, slot_A

    def combine(y_eCD, expert_bsk, slot_A, gates_bsk):
        y_ECD = y_eCD.reshape(e_loc, ep, C, D).transpose(1, 0, 2, 3).reshape(E, C, D)
        if ep > 1:
            y_ECD = jax.lax.all_to_all(y_ECD, EXPERT_AXIS, 0, 0, tiled=True)
        b = expert_bsk.shape[0]
        out = _combine_local(
            y_ECD, expert_bsk.reshape(b * S, k), slot_A, gates_bsk.reshape(b * S, k)
        )
        return out.reshape(b, S, D)

    x_BSD = constrain(x_BSD, mesh, BATCH_AXES, None, None)
    buf, slot_A = jax.shard_map(
        dispatch, mesh=mesh, in_specs=(tok_spec, tok_spec), out_specs=(buf_spec, slot_spec)
    )(x_BSD, expert_BSk)
    y = _expert_mlp(buf, wi_0, wi_1, wo, dt, mesh, fp8_metas, mxfp8)
    return jax.shard_map(
        combine, mesh=mesh, in_specs=(buf_spec, tok_spec, slot_spec, tok_spec), out_specs=tok_spec
    )(y, expert_BSk, slot_A, gates_BSk)


def backward_buffer_bytes(cfg, tokens: int, expert_shards: int) -> int:
    """Bytes of the dispatch-sized buffers the routed experts' backward holds besides the layer's
    residuals.

    Each is ``[E, C, D]`` per device in the compute dtype (``C = cfg.capacity(tokens)`` for a
    device's ``tokens``; under expert parallelism ``[E / expert_shards, expert_shards × C, D]``, the
    same bytes), all live while the expert MLP is back-propagated (deviceless XLA:GPU compiles of
    DeepSeek-V3, expert=8, 8 × 4096 per device: six such buffers at the peak, two of them
    residuals the layer's residual set already counts — the dispatch buffer and the combine's
    received outputs):

    * the expert outputs' gradient (the combine gathers' transpose; received by its backward
      all-to-all);
    * the expert inputs' gradient (the ``dh·Wᵀ`` GEMMs), before it is scattered back to the tokens;
    * with ``expert_shards`` > 1, that gradient's re-laid copy the dispatch's backward all-to-all
      sends, and the send buffer of the rematerialised combine's all-to-all, in flight across the
      backward's GEMMs.
    """
    buffers = 4 if expert_shards > 1 else 2
    # moe_impl=ragged: the sorted assignments, tokens × k rows (under expert parallelism the ring's
    # rows, ring_rows_factor), not E × C slots.
    rows = (
        tokens * cfg.num_experts_per_tok * ring_rows_factor(cfg, expert_shards)
        if getattr(cfg, "moe_impl", "capacity") == "ragged"
        else cfg.num_experts * cfg.capacity(tokens)
    )
    return int(buffers * rows * cfg.d_model * jnp.dtype(cfg.dtype).itemsize)


def ring_rows_factor(cfg, expert_shards: int) -> float:
    """Rows of ``moe_impl=ragged``'s grouped GEMMs per device over the ``tokens × k`` assignments of
    the device's own tokens: 1 without expert parallelism; under it the ring's buffer
    (:func:`_ragged_dispatch`), ``expert_shards × tokens × min(E / expert_shards, k)`` rows — the
    expert group's tokens, each with at most that many choices among the shard's experts — so
    ``expert_shards · min(E / expert_shards, k) / k``.  The capacity form: 1 (its buffers are sized
    by :meth:`capacity`)."""
    if getattr(cfg, "moe_impl", "capacity") != "ragged" or expert_shards <= 1:
        return 1.0
    k = cfg.num_experts_per_tok
    return expert_shards * min(cfg.num_experts // expert_shards, k) / k


def ragged_collective_bytes(cfg, tokens: int, expert_shards: int) -> float:
    """Per-device bytes one ``moe_impl=ragged`` layer's forward sends over ``expert``
    (:func:`_ragged_dispatch`): the all-gather of the tokens (compute dtype), their experts (int32)
    and gates (float32), and the reduce-scatter of the partial outputs (compute dtype); a ring
    all-gather or reduce-scatter of ``n`` bytes in all sends ``(ep − 1)/ep · n`` per device."""
    ep = expert_shards
    if ep <= 1:
        return 0.0
    item = jnp.dtype(cfg.dtype).itemsize
    k = cfg.num_experts_per_tok
    gathered = ep * tokens * (cfg.d_model * item + k * (4 + 4))
    scattered = ep * tokens * cfg.d_model * item
    return (ep - 1) / ep * (gathered + scattered)


def dropped_in_batch(x_BSD, router_DE, cfg, batch_shards: int = 1):
    """Assignments the capacity drops for ``x_BSD`` split into ``batch_shards`` equal device
    batches.

    Returns an int array (summed over shards); 0 means the layer computed every choice.
    """
    B, S, D = x_BSD.shape
    _, expert_BSk = route(x_BSD.reshape(B * S, D), router_DE, cfg)
    per = expert_BSk.reshape(batch_shards, (B // batch_shards) * S, -1)
    C = cfg.capacity((B // batch_shards) * S)
    return jnp.sum(jax.vmap(lambda e: dropped_assignments(e, cfg.num_experts, C))(per))


def require_moe_runs(cfg, target: str, platform: str) -> None:
    """Refuse an MoE implementation the ``platform`` ("gpu", "tpu", "cpu") of ``target`` does not
    offer: grouped matmuls (``moe_impl=ragged``) run on TPU targets only.

    Raises:
      TieraxError: naming the fix.
    """
    if getattr(cfg, "num_experts", 0) and getattr(cfg, "moe_impl", "capacity") == "ragged":
        if platform == "gpu":
            raise TieraxError(
                f"moe_impl=ragged (grouped matmuls, ragged_dot) is offered for TPU targets only: "
                f"XLA:GPU lowers ragged_dot to a masked dense GEMM; for the GPU target {target!r} "
                "use moe_impl=capacity (--set moe_impl=capacity)"
            )
