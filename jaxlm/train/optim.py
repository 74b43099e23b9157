"""The optimiser: AdamW, LAMB or Adafactor, warm-up then linear decay, decay mask, global-norm clipping; the
rejection of loss spikes; reductions over a whole tree of parameters or gradients."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlm.parallel.logical import spec_of, target_platform

if TYPE_CHECKING:  # jaxlm.config validates optim.name against OPTIMIZERS, so it imports this module
    from jaxlm.config import OptimConfig

NO_DECAY_NAMES = ("bias", "scale")


def schedule(config: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = min(config.warmup_steps, max(total_steps - 1, 0))
    return optax.join_schedules(
        [optax.linear_schedule(0.0, config.peak_lr, max(warmup, 1)),
         optax.linear_schedule(config.peak_lr, config.end_lr, max(total_steps - warmup, 1))],
        boundaries=[warmup])


def _path_names(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def decay_mask(params):
    """True where weight decay applies: matrices and embeddings, not LayerNorm scales or biases."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not any(n in NO_DECAY_NAMES for n in _path_names(path)), params)


def stacks_reductions() -> bool:
    """Whether `stacked_by_shape` stacks: when the step is built for GPUs."""
    return target_platform() == "gpu"


def stacked_by_shape(tree) -> list[jax.Array]:
    """The tree's leaves for a reduction over all of them. Built for GPUs, those of one shape, dtype and layout
    are stacked into one array (a transformer's layers give each group one leaf per layer; the layout is the
    type's under explicit axes, else the same for all), which a GPU reduces in one kernel, reading the leaves
    where they lie, instead of one or two kernels per leaf: BERT-base's gradient norm and finiteness test took
    566 reductions of its 596 optimizer kernels, most of a few kilobytes, where a launch outweighs the bytes.
    Elsewhere the leaves as they are: XLA writes such stacks to memory on TPUs, a copy of the parameters."""
    if not stacks_reductions():
        return jax.tree.leaves(tree)
    groups: dict[tuple, list[jax.Array]] = {}
    for leaf in jax.tree.leaves(tree):
        groups.setdefault((leaf.shape, jnp.dtype(leaf.dtype), spec_of(leaf)), []).append(leaf)
    return [jnp.stack(group) if len(group) > 1 else group[0] for group in groups.values()]


def global_norm(tree) -> jax.Array:
    """The L2 norm of all the tree's elements, in float32 (optax.tree.norm's value, summed by group)."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(group.astype(jnp.float32))) for group in stacked_by_shape(tree)))


def all_finite(tree) -> jax.Array:
    """True when no element of the tree is NaN or infinite."""
    return jnp.all(jnp.stack([jnp.isfinite(group).all() for group in stacked_by_shape(tree)]))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """optax.clip_by_global_norm (the same scaling of the same norm), its norm from `global_norm`."""

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        return jax.tree.map(lambda t: jax.lax.select(norm < max_norm, t, (t / norm.astype(t.dtype)) * max_norm),
                            updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def _adam(factory):
    def make(config: OptimConfig, learning_rate: optax.Schedule) -> optax.GradientTransformation:
        return factory(learning_rate, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay,
                       mask=decay_mask)
    return make


def adafactor(config: OptimConfig, learning_rate: optax.Schedule) -> optax.GradientTransformation:
    """T5's Adafactor (optax's defaults: second moments factored into a row and a column per matrix, decaying by
    step^-0.8; updates clipped to RMS 1 and scaled by each parameter's RMS), with momentum `b1` where it is above
    0 and weight decay as AdamW's, `weight_decay` times the learning rate (optax's rate is not scaled by it)."""
    return optax.adafactor(learning_rate, momentum=config.b1 or None,
                           weight_decay_rate=(lambda step: config.weight_decay * learning_rate(step))
                           if config.weight_decay else None, weight_decay_mask=decay_mask)


OPTIMIZERS = {"adamw": _adam(optax.adamw), "lamb": _adam(optax.lamb), "adafactor": adafactor}


def make_optimizer(config: OptimConfig, total_steps: int,
                   learning_rate: optax.Schedule | None = None) -> optax.GradientTransformation:
    """Clipping, then AdamW, LAMB or Adafactor on `learning_rate` (default: the config's warm-up and linear
    decay)."""
    if config.name not in OPTIMIZERS:
        raise ValueError(f"unknown optimiser {config.name!r}; choose one of {', '.join(OPTIMIZERS)}")
    base = OPTIMIZERS[config.name](config, learning_rate or schedule(config, total_steps))
    clip = clip_by_global_norm(config.clip_norm) if config.clip_norm > 0 else optax.identity()
    return optax.chain(clip, base)


class LossSpikeState(NamedTuple):
    recent_losses: jax.Array  # the last `window` accepted losses, a ring
    losses_seen: jax.Array  # accepted losses so far
    loss_spikes: jax.Array  # steps rejected as spikes so far
    last_step_spiked: jax.Array


def reject_loss_spikes(sigmas: float, window: int) -> optax.GradientTransformationExtraArgs:
    """Chained before optax.apply_if_finite: a step whose loss (the `loss` extra argument) is more than
    `sigmas` standard deviations above the mean of the last `window` accepted losses gets non-finite
    gradients, so apply_if_finite drops its update as it drops a non-finite step, and counts it among
    the skipped steps in a row. No step is a spike before `window` losses were accepted. (optax has no
    loss-based test; this one reuses its rejection, which holds the only copy of the optimiser state.)"""

    def init(params):
        del params
        zero = jnp.zeros((), jnp.int32)
        return LossSpikeState(jnp.zeros(window, jnp.float32), zero, zero, jnp.zeros((), bool))

    def update(updates, state: LossSpikeState, params=None, *, loss, **extra_args):
        del params, extra_args
        loss = loss.astype(jnp.float32)
        mean, spread = state.recent_losses.mean(), state.recent_losses.std()
        spike = (state.losses_seen >= window) & (loss > mean + sigmas * spread)
        accepted = jnp.isfinite(loss) & ~spike
        recent = jnp.where(accepted, state.recent_losses.at[state.losses_seen % window].set(loss), state.recent_losses)
        updates = jax.tree.map(lambda g: jnp.where(spike, jnp.full_like(g, jnp.nan), g), updates)
        return updates, LossSpikeState(recent, state.losses_seen + accepted, state.loss_spikes + spike, spike)

    return optax.GradientTransformationExtraArgs(init, update)
