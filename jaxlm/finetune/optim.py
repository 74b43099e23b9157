"""ULMFiT's fine-tuning controls as optax transformations for any jaxlm parameter tree: depth groups of the
parameters, freezing all but the top groups, discriminative (per-layer) rates, gradual unfreezing, and
the slanted triangular schedule (Howard & Ruder 2018). Chain them after the optimiser: they scale its
final updates, so a frozen parameter stays bit-identical (weight decay included)."""
from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

LAYER = re.compile(r"layer_(\d+)")
BACKBONES = ("encoder", "decoder", "shared")  # top-level groups of a backbone; every other one is a head
HEAD_PARTS = ("pooler",)  # inside a backbone but trained as the head: BERT's pooler sits on top


def _names(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def _stack_depths(params) -> dict[str, int]:
    """Layers per stack ("encoder", "decoder"): the layer_i count, a scanned stack's leading axis, or
    1 for ALBERT's one shared layer."""
    depths: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = _names(path)
        for name in names[1:]:
            match = LAYER.fullmatch(name)
            depth = (int(match.group(1)) + 1 if match else leaf.shape[0] if name == "layers"
                     else 1 if name == "layer" else 0)
            if depth:
                depths[names[0]] = max(depths.get(names[0], 0), depth)
                break
    return depths


def layer_groups(params) -> tuple[object, int]:
    """(a tree like `params` of depth groups, the top group). Group 0: the backbone's embeddings and
    whatever else in it is not a layer (final norms, relative position biases); 1..L: the layers from
    the bottom (an encoder's before a decoder's; a scanned stack's leaf holds an array of its layers'
    groups along its leading axis; ALBERT's shared layer is one group); L + 1: the head (every top-level
    group outside the backbone, and BERT's pooler)."""
    depths = _stack_depths(params)
    offsets, total = {}, 0
    for stack in sorted(depths, key=lambda s: (s != "encoder", s)):
        offsets[stack], total = total, total + depths[stack]
    top = total + 1

    def group(path, leaf):
        names = _names(path)
        if names[0] not in BACKBONES or any(part in names for part in HEAD_PARTS):
            return top
        for name in names[1:]:
            match = LAYER.fullmatch(name)
            if match:
                return offsets[names[0]] + int(match.group(1)) + 1
            if name == "layers":
                return offsets[names[0]] + 1 + np.arange(leaf.shape[0])
            if name == "layer":
                return offsets[names[0]] + 1
        return 0

    return jax.tree_util.tree_map_with_path(group, params), top


class StepCount(NamedTuple):
    count: jax.Array


def _scale_by_group(params, factor) -> optax.GradientTransformation:
    """Multiplies each update by `factor(group, step)` of its parameter's depth group."""
    groups, top = layer_groups(params)

    def init(_):
        return StepCount(jnp.zeros((), jnp.int32))

    def update(updates, state, params=None):
        def scale(update, group):
            f = factor(jnp.asarray(group), top, state.count)
            return update * f.reshape(f.shape + (1,) * (update.ndim - f.ndim)).astype(update.dtype)

        return jax.tree.map(scale, updates, groups), StepCount(state.count + 1)

    return optax.GradientTransformation(init, update)


def discriminative_lr(params, decay: float) -> optax.GradientTransformation:
    """Group g's updates times decay ** (top - g): the head at the full rate, each layer down `decay`
    times its upper neighbour's (ULMFiT: 1 / 2.6)."""
    return _scale_by_group(params, lambda g, top, _: jnp.float32(decay) ** (top - g))


def train_top_groups(params, k: int) -> optax.GradientTransformation:
    """Only the top `k` groups change (k = 1: the head alone, "freeze the body")."""
    return _scale_by_group(params, lambda g, top, _: (top - g < k).astype(jnp.float32))


def gradual_unfreezing(params, steps_per_stage: int) -> optax.GradientTransformation:
    """At step s only the top 1 + s // steps_per_stage groups change: the head first, then one more
    layer group each stage (ULMFiT unfreezes one per epoch)."""
    return _scale_by_group(params, lambda g, top, s: (top - g < 1 + s // steps_per_stage).astype(jnp.float32))


def slanted_triangular(total_steps: int, peak_lr: float, cut_frac: float = 0.1, ratio: float = 32) -> optax.Schedule:
    """ULMFiT's eq. (3): a linear rise for the first cut_frac of the steps from peak / ratio to the
    peak, then a linear fall back to peak / ratio at the end."""
    cut = max(1, int(np.floor(total_steps * cut_frac)))

    def schedule(step):
        t = jnp.asarray(step, jnp.float32)
        p = jnp.where(t < cut, t / cut, 1 - (t - cut) / (cut * (1 / cut_frac - 1)))
        return peak_lr * (1 + jnp.clip(p, 0, 1) * (ratio - 1)) / ratio

    return schedule


def check_ulmfit(train_layers: int, layer_lr_decay: float, unfreeze_every: float) -> None:
    """ValueError naming the first of ULMFiT's settings (`ulmfit`'s arguments) out of its range."""
    if train_layers < -1:
        raise ValueError(f"finetune.train_layers={train_layers}: use -1 (every layer), 0 (the head only) or the "
                         "number of top layers to train")
    if not 0 < layer_lr_decay <= 1:
        raise ValueError(f"finetune.layer_lr_decay={layer_lr_decay} must be in (0, 1] (ULMFiT uses 1/2.6)")
    if unfreeze_every < 0:
        raise ValueError(f"finetune.unfreeze_every={unfreeze_every} must not be negative")


def ulmfit(params, *, train_layers: int = -1, layer_lr_decay: float = 1.0,
           unfreeze_every: int = 0) -> optax.GradientTransformation:
    """The three together, to chain after the optimiser. `train_layers`: -1 every group trains, 0 the
    head only, k the head and the last k layers; `layer_lr_decay`: the per-layer factor (1: none);
    `unfreeze_every`: steps per gradual-unfreezing stage (0: none)."""
    check_ulmfit(train_layers, layer_lr_decay, unfreeze_every)
    parts = []
    if train_layers >= 0:
        parts.append(train_top_groups(params, train_layers + 1))
    if layer_lr_decay != 1.0:
        parts.append(discriminative_lr(params, layer_lr_decay))
    if unfreeze_every:
        parts.append(gradual_unfreezing(params, unfreeze_every))
    return optax.chain(*parts)
