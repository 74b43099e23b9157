"""Pure train and eval steps: (state, batch, rng) -> (state, metrics); built for any objective."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxlm.config import DROPOUT_RNGS, TrainConfig
from jaxlm.parallel.logical import constrain
from jaxlm.train.optim import all_finite, global_norm, stacks_reductions
from jaxlm.train.state import TrainState

COUNT_SUFFIX = "_count"


def micro_batches(batch: dict, grad_accum: int, batch_axes: dict) -> dict:
    """[grad_accum, B / grad_accum, ...] per field, micro-batch i holding rows i, i + grad_accum, ...

    Strided rather than contiguous: a device's contiguous block of the batch splits evenly across the
    micro-batches, so each device keeps its own rows and no activation moves between devices."""
    def split(x, axes):
        x = x.reshape(x.shape[0] // grad_accum, grad_accum, *x.shape[1:]).swapaxes(0, 1)
        return constrain(x, (None, *axes))

    return {name: split(x, batch_axes[name]) for name, x in batch.items()}


def batch_counts(objective, params, batch: dict, rng) -> dict:
    """The weight sums (`*_count` stats) of the whole batch. They depend on the batch alone, so XLA
    removes the forward pass that computing them through `objective.stats` traces."""
    stats = objective.stats(params, batch, rng)
    return {k: jax.lax.stop_gradient(v) for k, v in stats.items() if k.endswith(COUNT_SUFFIX)}


def make_gradients(objective, grad_accum: int = 1):
    """(params, batch, rng) -> (gradients of the batch's loss, summed stats). With `grad_accum`
    micro-batches each one's summed losses are divided by the whole batch's weights, so the
    accumulated gradient is the full batch's gradient."""
    if grad_accum == 1:
        def whole(params, batch, rng):
            (_, stats), grads = jax.value_and_grad(objective.loss, has_aux=True)(params, batch, rng)
            return grads, stats

        return whole

    def micro_loss(params, micro, rng, counts):
        stats = objective.stats(params, micro, rng)
        return objective.summarize(stats | counts)["loss"], stats

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def accumulated(params, batch, rng):
        counts = batch_counts(objective, params, batch, rng)
        micro = micro_batches(batch, grad_accum, objective.batch_axes)

        def add(carry, inputs):
            index, one = inputs
            one = {k: constrain(v, objective.batch_axes[k]) for k, v in one.items()}
            (_, stats), grads = grad_fn(params, one, jax.random.fold_in(rng, index), counts)
            return jax.tree.map(jnp.add, carry, (grads, stats)), None

        first = jax.tree.map(lambda x: x[0], micro)
        (_, stats_shape), grads_shape = jax.eval_shape(grad_fn, params, first, rng, counts)
        zeros = jax.tree.map(jnp.zeros_like, (grads_shape, stats_shape))
        (grads, stats), _ = jax.lax.scan(add, zeros, (jnp.arange(grad_accum), micro))
        return grads, stats

    return accumulated


def dropout_key(train: TrainConfig) -> jax.Array:
    """The key every step's dropout masks come from (the step folds in its number): train.seed's, in the
    generator train.dropout_rng names (threefry: `jax.random.key(train.seed)` under JAX's default generator)."""
    return jax.random.key(train.seed, impl=DROPOUT_RNGS[train.dropout_rng])


def init_key(train: TrainConfig) -> jax.Array:
    """The key the parameters are initialised from: train.seed's, folded with 1 (apart from the dropout key)."""
    return jax.random.fold_in(jax.random.key(train.seed), 1)


def make_train_step(objective, optimizer: optax.GradientTransformation, schedule, grad_accum: int = 1):
    """A pure step: the batch's gradient (over `grad_accum` micro-batches), one optimiser update."""
    gradients = make_gradients(objective, grad_accum)
    optimizer = optax.with_extra_args_support(optimizer)

    def train_step(state: TrainState, batch: dict, rng: jax.Array):
        rng = jax.random.fold_in(rng, state.step)
        grads, stats = gradients(state.params, batch, rng)
        metrics = dict(objective.summarize(stats))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params, loss=metrics["loss"])
        params = optax.apply_updates(state.params, updates)
        metrics["grad_norm"] = global_norm(grads)
        metrics["lr"] = schedule(state.step)
        skipping = optax.tree.get(opt_state, "notfinite_count")  # train.nonfinite=skip: such an update was dropped
        if skipping is not None:
            metrics["nonfinite_in_a_row"] = skipping
            metrics["skipped_steps"] = optax.tree.get(opt_state, "total_notfinite")
            if optax.tree.get(opt_state, "loss_spikes") is not None:  # train.spike_sigmas: some were spikes
                metrics["loss_spikes"] = optax.tree.get(opt_state, "loss_spikes")
                metrics["last_step_spiked"] = optax.tree.get(opt_state, "last_step_spiked")
        else:
            # Stacked, the new parameters (the same test where the old ones were finite): XLA reads the stacked
            # updates by computing them again (BERT-base: 1.3 GB more). Unstacked (TPUs), the new parameters'
            # test keeps a copy of something in memory that the updates' does not (BERT-tiny: +0.4 MB of 8.3).
            checked = params if stacks_reductions() else updates
            finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"]) & all_finite(checked)
            metrics["nonfinite_in_a_row"] = jnp.logical_not(finite).astype(jnp.int32)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(objective):
    """Summed stats of one held-out batch, deterministic (no dropout)."""

    def eval_step(params, batch: dict) -> dict:
        return objective.stats(params, batch, None, deterministic=True)

    return eval_step
