"""The optimiser: AdamW or LAMB, warm-up then linear decay, decay mask, global-norm clipping."""
from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import optax

if TYPE_CHECKING:  # jaxlm.config validates optim.name against OPTIMIZERS, so it imports this module
    from jaxlm.config import OptimConfig

NO_DECAY_NAMES = ("bias", "scale")
OPTIMIZERS = {"adamw": optax.adamw, "lamb": optax.lamb}


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


def make_optimizer(config: OptimConfig, total_steps: int,
                   learning_rate: optax.Schedule | None = None) -> optax.GradientTransformation:
    """Clipping, then AdamW or LAMB on `learning_rate` (default: the config's warm-up and linear decay)."""
    if config.name not in OPTIMIZERS:
        raise ValueError(f"unknown optimiser {config.name!r}; choose one of {', '.join(OPTIMIZERS)}")
    learning_rate = learning_rate or schedule(config, total_steps)
    base = OPTIMIZERS[config.name](learning_rate, b1=config.b1, b2=config.b2, eps=config.eps,
                                   weight_decay=config.weight_decay, mask=decay_mask)
    clip = optax.clip_by_global_norm(config.clip_norm) if config.clip_norm > 0 else optax.identity()
    return optax.chain(clip, base)
