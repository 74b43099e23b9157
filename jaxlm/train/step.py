"""Pure train and eval steps: (state, batch, rng) -> (state, metrics); built for any objective."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxlm.train.state import TrainState


def _split_micro(batch: dict, grad_accum: int) -> dict:
    return jax.tree.map(lambda x: x.reshape(grad_accum, x.shape[0] // grad_accum, *x.shape[1:]), batch)


def make_train_step(objective, optimizer: optax.GradientTransformation, schedule, grad_accum: int = 1):
    """A pure step; gradients of `grad_accum` micro-batches are averaged before one update."""
    grad_fn = jax.value_and_grad(objective.loss, has_aux=True)

    def train_step(state: TrainState, batch: dict, rng: jax.Array):
        rng = jax.random.fold_in(rng, state.step)
        if grad_accum == 1:
            (_, stats), grads = grad_fn(state.params, batch, rng)
        else:
            def micro(carry, inputs):
                grads_sum, stats_sum = carry
                index, micro_batch = inputs
                (_, stats), grads = grad_fn(state.params, micro_batch, jax.random.fold_in(rng, index))
                return (jax.tree.map(jnp.add, grads_sum, grads), jax.tree.map(jnp.add, stats_sum, stats)), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            first = jax.tree.map(lambda x: x[0], _split_micro(batch, grad_accum))
            stats_zero = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: objective.loss(state.params, first, rng)[1]))
            (grads, stats), _ = jax.lax.scan(
                micro, (zeros, stats_zero), (jnp.arange(grad_accum), _split_micro(batch, grad_accum)))
            grads = jax.tree.map(lambda g: g / grad_accum, grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(objective.summarize(stats))
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["lr"] = schedule(state.step)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(objective):
    """Summed stats of one held-out batch, deterministic (no dropout)."""

    def eval_step(params, batch: dict) -> dict:
        return objective.stats(params, batch, None, deterministic=True)

    return eval_step
