"""The two layer layouts of a parameter tree: layer_0..layer_{N-1} subtrees (loop) and one stacked
`layers` subtree with a leading layer axis (scan), and the conversion between them."""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

_LAYER = re.compile(r"^(?P<prefix>.+)_(?P<index>\d+)$")


def _layer_groups(tree: Mapping) -> dict[str, list[str]]:
    """{"layer": ["layer_0", "layer_1", ...]} for every prefix numbered 0..N-1 among the keys."""
    groups: dict[str, dict[int, str]] = {}
    for key in tree:
        match = _LAYER.match(key)
        if match and isinstance(tree[key], Mapping):
            groups.setdefault(match["prefix"], {})[int(match["index"])] = key
    return {prefix: [found[i] for i in range(len(found))] for prefix, found in groups.items()
            if sorted(found) == list(range(len(found)))}


def stack_layers(tree: Mapping) -> dict:
    """Loop layout -> scan layout, at every depth: `layer_i` subtrees become one `layers` subtree."""
    out = {}
    groups = _layer_groups(tree)
    members = {key for keys in groups.values() for key in keys}
    for prefix, keys in groups.items():
        layers = [tree[k] for k in keys]
        out[f"{prefix}s"] = _stack([stack_layers(layer) for layer in layers])
    for key, value in tree.items():
        if key not in members:
            out[key] = stack_layers(value) if isinstance(value, Mapping) else value
    return out


def _stack(trees: list) -> dict | np.ndarray:
    if isinstance(trees[0], Mapping):
        return {k: _stack([t[k] for t in trees]) for k in trees[0]}
    return np.stack([np.asarray(t) for t in trees])


def unstack_layers(tree: Mapping, scanned: tuple[str, ...] = ("layers",)) -> dict:
    """Scan layout -> loop layout: each subtree named in `scanned` (e.g. `layers`) becomes `layer_0..`."""
    out = {}
    for key, value in tree.items():
        if key in scanned and isinstance(value, Mapping):
            count = len(next(iter(_leaves(value))))
            for i in range(count):
                out[f"{key[:-1]}_{i}"] = _index(value, i)
        else:
            out[key] = unstack_layers(value, scanned) if isinstance(value, Mapping) else value
    return out


def _leaves(tree: Mapping):
    for value in tree.values():
        yield from (_leaves(value) if isinstance(value, Mapping) else (value,))


def _index(tree: Mapping, i: int) -> dict:
    return {k: _index(v, i) if isinstance(v, Mapping) else np.asarray(v)[i] for k, v in tree.items()}
