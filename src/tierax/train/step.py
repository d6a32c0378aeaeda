"""The training step: loss, gradients and an Optax AdamW update, jitted with donated state.

The model is split once into an NNX graph definition (static) and a parameter
state (a pytree); everything jitted is a pure function of pytrees.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tierax import plan as plan_lib
from tierax.errors import TieraxError
from tierax.models import ModelConfig, build_model, fp8, layers
from tierax.models import loss as loss_lib
from tierax.models.documents import target_weights
from tierax.sharding import rules as sh
from tierax.train import accumulate, masters, streamed


class TrainState(NamedTuple):
    """The training state.  ``params`` are the master weights (those a plan offloads in host
    memory); ``compute_params``: the device's compute-dtype copies of the offloaded masters, keyed
    by tree path (:mod:`tierax.train.masters`), None when the plan offloads none."""

    params: Any
    opt_state: Any
    step: jax.Array
    compute_params: Any = None


def model_params(state: TrainState):
    """The parameters the model runs on: the masters with the compute copies in place of the
    offloaded ones (what validation and the loss take)."""
    return masters.forward_params(state.params, state.compute_params)


def make_optimizer(
    learning_rate: float | optax.Schedule = 1e-3,
    weight_decay: float = 0.1,
    *,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    grad_clip: float | None = None,
    mu_dtype: str | None = None,
) -> optax.GradientTransformation:
    """AdamW (decoupled weight decay), optionally after clipping the global gradient norm.

    Args:
      learning_rate: a constant or an Optax schedule of the update count (0 for the
        first update), e.g. ``optax.warmup_cosine_decay_schedule``.
      grad_clip: clip gradients to this global norm first (Optax's clip, which also takes the
        norm from outside when the update streams: :func:`tierax.train.streamed.
        clip_by_global_norm`); None: no clipping (the optimizer state is then AdamW's own,
        without a chain around it).
      mu_dtype: the first moment's dtype (a model config's ``mu_dtype``); None or "": the
        parameters' dtype.
    """
    adamw = optax.adamw(
        learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mu_dtype=mu_dtype or None
    )
    if grad_clip is None:
        return adamw
    return optax.chain(streamed.clip_by_global_norm(grad_clip), adamw)


def make_loss_fn(graphdef, policies, mesh: Mesh | None = None) -> Callable:
    """``loss(params, tokens_BT, segments_BT=None) -> mean next-token cross-entropy`` (float32).

    The logits are computed in ``cfg.loss_tiles`` chunks (:mod:`tierax.models.loss`).
    ``mesh``: the mesh the step runs on (sharding constraints, the expert-parallel
    MoE's shard_map); None on one device.  ``segments_BT``: packed documents' ids
    (:mod:`tierax.models.documents`): attention stays within a document, positions restart,
    and the mean is over the targets in their input's document.
    """
    platform = step_platform(mesh)
    mesh = None if mesh is None or mesh.size == 1 else mesh

    def loss(params, tokens_BT, segments_BT=None):
        model = nnx.merge(graphdef, params)
        if mesh is not None:
            sh.check_batch(tokens_BT.shape[0], mesh)
        seg_BS = None if segments_BT is None else segments_BT[:, :-1]
        weights = None if segments_BT is None else target_weights(segments_BT)
        with layers.traced_for(platform):  # forms chosen per platform (layers.rope)
            hidden_BSD = model.hidden(tokens_BT[:, :-1], policies, mesh, seg_BS)
        return loss_lib.cross_entropy(
            hidden_BSD,
            model.output_weight(),
            tokens_BT[:, 1:],
            tiles=model.cfg.loss_tiles,
            mesh=mesh,
            weights_BS=weights,
            platform=platform,
        )

    return loss


def step_platform(mesh: Mesh | None) -> str:
    """The platform a step on ``mesh`` is compiled for (a deviceless TPU topology's devices say
    "tpu" too); without a mesh, JAX's default backend."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def mesh_of(tree) -> Mesh | None:
    """The mesh of a pytree's NamedShardings (arrays, ShapeDtypeStructs or shardings); None if
    none."""
    for leaf in jax.tree.leaves(tree):
        sharding = leaf if isinstance(leaf, NamedSharding) else getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return sharding.mesh
    return None


def init_params(cfg: ModelConfig, *, seed: int = 0, mesh: Mesh | None = None):
    """(graphdef, params); with a mesh the params are created already sharded."""
    if mesh is not None:
        sh.check_step(cfg, mesh)
    # Flax's global eager-sharding default is stamped into every Param's metadata, so an init
    # cached under one value cannot build the params under the other (MaxText's import turns it
    # off).
    eager = bool(getattr(flax.config, "flax_always_shard_variable", False))
    try:
        hash((cfg, mesh))
    except TypeError:  # a config holding an unhashable value: built as it is, not cached
        graphdef, init = _jitted_init.__wrapped__(cfg, seed, mesh, eager)
    else:
        graphdef, init = _jitted_init(cfg, seed, mesh, eager)
    return graphdef, init()


@functools.lru_cache(maxsize=8)
def _jitted_init(cfg: ModelConfig, seed: int, mesh: Mesh | None, eager_sharding: bool):
    """(graphdef, one jitted init of ``cfg``'s parameters): far faster than building the stacked
    layers eagerly op by op, and compiled once per (config, seed, mesh, Flax's eager-sharding
    default) in a process, so that a bench that builds each plan's state afresh in every round does
    not compile it again."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build_model(cfg, seed=seed)))
    shardings = None if mesh is None else sh.param_shardings(abstract, mesh)
    return graphdef, jax.jit(
        lambda: nnx.split(build_model(cfg, seed=seed))[1], out_shardings=shardings
    )


def init_state(
    cfg: ModelConfig,
    optimizer: optax.GradientTransformation,
    *,
    seed: int = 0,
    mesh: Mesh | None = None,
    plan: plan_lib.Plan | None = None,
):
    """(graphdef, TrainState); with a mesh, Adam moments are sharded like their parameters.

    ``plan``: its ``state`` placements put each layer group's offloaded moments and master weights
    in pinned host memory (:func:`tierax.plan.state_shardings`), the latter with a compute-dtype
    copy on the device (:mod:`tierax.train.masters`); :mod:`tierax.train.streamed` updates them."""
    graphdef, params = init_params(cfg, seed=seed, mesh=mesh)
    step = jnp.zeros((), jnp.int32)
    compute = None
    if plan is not None and plan.offloads_state:
        compute = masters.derive(params, masters.compute_shapes(plan, cfg, params))
    if mesh is None:
        opt_state = jax.jit(optimizer.init)(params)
        if plan is not None and plan.offloads_state:
            opt_state = place_moments(plan, opt_state)
            params = place_masters(plan, params)
        return graphdef, TrainState(params, opt_state, step, compute)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        jax.eval_shape(optimizer.init, params),
        shardings_of(params),
        transform_non_params=lambda _: replicated,
    )
    if plan is not None and plan.offloads_state:
        opt_shardings = plan_lib.state_shardings(plan, opt_shardings, "moments")
    opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(params)
    if plan is not None and plan.offloads_state:
        params = place_masters(plan, params)
    return graphdef, TrainState(params, opt_state, jax.device_put(step, replicated), compute)


def place_moments(plan: plan_lib.Plan, opt_state):
    """``opt_state`` (arrays) moved to the memory kinds ``plan``'s state places its moments in."""
    return jax.device_put(
        opt_state, plan_lib.state_shardings(plan, shardings_of(opt_state), "moments")
    )


def place_masters(plan: plan_lib.Plan, params):
    """``params`` (arrays) moved to the memory kinds ``plan``'s state places its masters in."""
    return jax.device_put(
        params, plan_lib.state_shardings(plan, shardings_of(params), "master_weights")
    )


def make_train_step(
    graphdef,
    cfg: ModelConfig,
    plan: plan_lib.Plan,
    optimizer: optax.GradientTransformation,
    state_shardings=None,
    *,
    grad_accum: int = 1,
    grad_clip: float | None = None,
) -> Callable:
    """A jitted ``step(state, tokens, segments=None) -> (state, metrics)``; ``state`` is donated.

    Args:
      state_shardings: shardings of the TrainState to keep on output (FSDP);
        None lets XLA choose (single device).  Given, the scalar metrics come back
        replicated on the same mesh, so every process can read them.
      grad_accum: microbatches per optimizer update.  1: ``tokens`` is
        ``[batch, seq + 1]``; more: ``tokens`` is ``[grad_accum, batch, seq + 1]``,
        gradients are summed over a ``lax.scan`` (float32) and averaged, so the
        update equals one step on all the sequences at once.  ``segments`` (same shape
        as ``tokens``): packed documents' ids (:func:`make_loss_fn`).
      grad_clip: the global-norm clip ``optimizer`` was made with (``make_optimizer``'s); with
        streamed moments the update takes the norm of every gradient first and clips each layer's
        slice by it (:func:`tierax.train.streamed.streamed_update`).

    With ``plan`` offloading a group's moments or master weights the update streams them layer
    by layer (:mod:`tierax.train.streamed`); ``state_shardings`` then carry their ``pinned_host``
    memory kind (:func:`init_state` with the plan) and are required.  Offloaded masters: the loss
    runs on the state's compute-dtype copies (:func:`model_params`), whose gradients are cast to
    the masters' dtype before the update (:mod:`tierax.train.masters`).
    """
    accumulate.check_runs(plan, grad_accum, "the train step")
    if plan.offloads_state and state_shardings is None:
        raise TieraxError(
            f"plan {plan.name!r} offloads training state: give the step its state_shardings "
            "(shardings_of(state) of init_state(..., plan=plan)), which carry the host memory kind"
        )
    if plan.offloads_state:
        plan_lib.require_host_memory(
            plan, jax.tree.leaves(state_shardings)[0].device_set, "the train step"
        )
    mesh = None if state_shardings is None else mesh_of(state_shardings)
    if mesh is not None:
        sh.check_step(cfg, mesh)
    loss_fn = make_loss_fn(graphdef, plan_lib.to_policies(plan, cfg), mesh)
    platform = step_platform(mesh)
    grad_fn = jax.value_and_grad(loss_fn)
    param_shardings = None if state_shardings is None else state_shardings.params
    if param_shardings is not None and masters.offloads_masters(plan):
        # The accumulator lives on the device, whatever memory the masters are in.
        param_shardings = jax.tree.map(lambda s: s.with_memory_kind("device"), param_shardings)

    def accumulated(params, master_params, tokens_ABT, segments_ABT):
        xs = (tokens_ABT,) if segments_ABT is None else (tokens_ABT, segments_ABT)
        loss_sum, grad_sum = accumulate.accumulate(grad_fn, params, xs, plan, param_shardings)
        grads, meta = fp8.split_meta(grad_sum)
        grads = jax.tree.map(lambda g, p: (g / grad_accum).astype(p.dtype), grads, master_params)
        return loss_sum / grad_accum, fp8.overwrite_meta(grads, meta)

    def step(state: TrainState, tokens, segments=None):
        # Offloaded masters: the loss runs on their compute copies; the gradient with respect to a
        # copy, cast to the master's dtype, is the master's (tierax.train.masters).
        forward = model_params(state)
        if grad_accum == 1:
            loss, grads = grad_fn(forward, tokens, segments)
            grads = masters.to_master_dtypes(grads, state.params)
        else:
            loss, grads = accumulated(forward, state.params, tokens, segments)
        # fp8 scales and amax histories are not trained: the optimizer sees a zero gradient for
        # them and they take their "gradient", their next value, in place of its update.
        grads, meta = fp8.split_meta(grads)
        compute = state.compute_params
        if streamed.offloaded_groups(plan):
            params, opt_state, compute = streamed.streamed_update(
                optimizer,
                grads,
                state.opt_state,
                state.params,
                plan,
                clipped=grad_clip is not None,
                compute=compute,
            )
        else:
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        params = fp8.overwrite_meta(params, meta)
        metrics = {"loss": loss, "grad_norm": global_norm(grads, platform)}
        return TrainState(params, opt_state, state.step + 1, compute), metrics

    out = None
    if state_shardings is not None:
        lead = jax.tree.leaves(state_shardings)[0]
        scalar = (
            NamedSharding(lead.mesh, PartitionSpec())
            if isinstance(lead, NamedSharding)
            else lead.with_memory_kind("device")
        )
        out = (state_shardings, scalar)
    return jax.jit(step, donate_argnums=(0,), out_shardings=out)


def global_norm(tree, platform: str) -> jax.Array:
    """The gradients' global norm (float32), its squares kept apart from the optimizer's where that
    saves HBM traffic on ``platform``.

    Optax's Adam squares each gradient with the same HLO multiply as this norm, and CSE merges the
    two.  XLA:CPU then writes the shared square out in full and reads it back for this reduction
    (one extra write and read of every gradient per step), so on a CPU an optimization barrier (a
    no-op at run time) keeps the squares apart and the norm is fused into its own read.  XLA:TPU
    instead fuses the merged square's reduction into the update's own pass over the gradients; the
    barrier there forces a separate pass, one extra read of every gradient per step
    (tests/test_train_step_norm.py compiles both).  No GPU compile has shown either way: GPUs keep
    the barrier, as before this choice.
    """
    leaves = [g.astype(jnp.float32) for g in jax.tree.leaves(tree)]
    if platform != "tpu":
        leaves = jax.lax.optimization_barrier(leaves)
    return jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))


def shardings_of(tree):
    return jax.tree.map(lambda x: x.sharding, tree)


def loss_and_grads(graphdef, cfg: ModelConfig, plan: plan_lib.Plan, params, tokens_BT):
    """Loss and gradients under ``plan`` (jitted, nothing donated): the check every plan must pass.

    Sharded ``params`` (on a mesh) run the sharded step: the mesh is taken from them.
    """
    loss_fn = make_loss_fn(graphdef, plan_lib.to_policies(plan, cfg), mesh_of(params))
    return jax.jit(jax.value_and_grad(loss_fn))(params, tokens_BT)


def synthetic_batch(cfg: ModelConfig, batch: int, seq: int, *, seed: int = 0) -> jax.Array:
    """Deterministic random tokens, shape [batch, seq + 1] (inputs and shifted targets)."""
    return jax.random.randint(
        jax.random.key(seed), (batch, seq + 1), 0, cfg.vocab_size, dtype=jnp.int32
    )
