"""Hugging Face tensor names <-> our parameter paths, for every family: the name-map entry, the layout
kinds that turn one side's tensor into the other's, builders of name maps, and conversion through one.

Our paths are '/'-joined keys of the loop-layout ``params`` tree (``encoder/layer_0/mlp/output/kernel``).
A name map is a dict of groups of entries; the first group must be in every checkpoint, each other
group (a pooler, a head) either wholly or not at all, and an absent one is left out of the tree.
"""
from __future__ import annotations

from typing import Iterator, Mapping, NamedTuple, Sequence

import flax.linen as nn
import numpy as np

from jaxlm.convert.layout import stack_layers, unstack_layers
from jaxlm.models.config import TransformerConfig

MAX_LISTED = 8


class Entry(NamedTuple):
    """One Hugging Face tensor: our path (a tuple of paths where it holds several of ours, as GPT-2's
    fused `c_attn` holds query, key and value), its name, and the layout kind between the two."""

    ours: str | tuple[str, ...]
    theirs: str
    kind: str = "copy"

    @property
    def paths(self) -> tuple[str, ...]:
        return self.ours if isinstance(self.ours, tuple) else (self.ours,)


# ---------------------------------------------------------------- layout kinds

def _split_heads(x, cfg: TransformerConfig):
    return x.reshape(*x.shape[:-1], -1, cfg.head_dim)


def _qkv_to_ours(x, cfg: TransformerConfig):
    return tuple(_split_heads(part, cfg) for part in np.split(x, 3, axis=-1))


def _qkv_to_hf(xs, cfg: TransformerConfig):
    return np.concatenate([x.reshape(*x.shape[:-2], -1) for x in xs], axis=-1)


# kind -> (their tensor -> our tensors, our tensors -> their tensor). torch's Linear stores [out, in],
# ours and GPT-2's Conv1D [in, out]; attention projections split the heads out: [in, heads, head_dim].
KINDS = {
    "copy": (lambda x, cfg: (x,), lambda xs, cfg: xs[0]),
    "row": (lambda x, cfg: (x.reshape(-1),), lambda xs, cfg: xs[0].reshape(1, -1)),
    "linear": (lambda x, cfg: (x.T,), lambda xs, cfg: xs[0].T),
    "heads_in": (lambda x, cfg: (_split_heads(x.T, cfg),), lambda xs, cfg: xs[0].reshape(cfg.hidden_size, -1).T),
    "heads_bias": (lambda x, cfg: (_split_heads(x, cfg),), lambda xs, cfg: xs[0].reshape(-1)),
    "heads_out": (lambda x, cfg: (x.T.reshape(-1, cfg.head_dim, cfg.hidden_size),),
                  lambda xs, cfg: xs[0].reshape(-1, cfg.hidden_size).T),
    "conv_heads_out": (lambda x, cfg: (x.reshape(-1, cfg.head_dim, cfg.hidden_size),),
                       lambda xs, cfg: xs[0].reshape(-1, cfg.hidden_size)),
    "qkv": (_qkv_to_ours, _qkv_to_hf),
}


def hf_shape(entry: Entry, shapes: Mapping[str, tuple[int, ...]], config: TransformerConfig) -> tuple[int, ...]:
    """The shape of `entry`'s Hugging Face tensor, given the shapes of our parameters."""
    return tuple(KINDS[entry.kind][1]([np.empty(shapes[p], np.float32) for p in entry.paths], config).shape)


# ---------------------------------------------------------------- building name maps

def dense(ours: str, theirs: str, kind: str = "linear", bias: bool = True) -> list[Entry]:
    """A torch Linear `theirs` as our Dense `ours`: kernel, and bias unless `bias=False`."""
    entries = [Entry(f"{ours}/kernel", f"{theirs}.weight", kind)]
    if bias:
        entries.append(Entry(f"{ours}/bias", f"{theirs}.bias", "heads_bias" if kind == "heads_in" else "copy"))
    return entries


def norm(ours: str, theirs: str) -> list[Entry]:
    """A LayerNorm: scale and bias."""
    return [Entry(f"{ours}/scale", f"{theirs}.weight"), Entry(f"{ours}/bias", f"{theirs}.bias")]


def attention(ours: str, theirs: Sequence[str], bias: bool = True) -> list[Entry]:
    """Our Attention `ours` from the Hugging Face query, key, value and output projections `theirs`."""
    query, key, value, output = theirs
    return [*dense(f"{ours}/query", query, "heads_in", bias), *dense(f"{ours}/key", key, "heads_in", bias),
            *dense(f"{ours}/value", value, "heads_in", bias), *dense(f"{ours}/output", output, "heads_out", bias)]


def encoder_layer(ours: str, theirs: str, names: Sequence[str]) -> list[Entry]:
    """Our post-LN encoder layer `ours` from the Hugging Face one `theirs`, whose sub-modules `names` are
    in the order query, key, value, attention output, attention norm, MLP in, MLP out, MLP norm."""
    query, key, value, output, attention_norm, mlp_in, mlp_out, mlp_norm = (f"{theirs}.{n}" for n in names)
    return [*attention(f"{ours}/attention", (query, key, value, output)),
            *norm(f"{ours}/attention_norm", attention_norm),
            *dense(f"{ours}/mlp/intermediate", mlp_in), *dense(f"{ours}/mlp/output", mlp_out),
            *norm(f"{ours}/mlp_norm", mlp_norm)]


# ---------------------------------------------------------------- trees

def flatten(tree: Mapping, prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from flatten(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def unflatten(flat: Mapping[str, object]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def plain(params: Mapping) -> Mapping:
    """A parameter tree unboxed, without its `params` level if it has one."""
    params = nn.unbox(params)
    return params["params"] if "params" in params else params


def listed(items: list[str]) -> str:
    more = f"; and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return "; ".join(items[:MAX_LISTED]) + more


# ---------------------------------------------------------------- Hugging Face -> ours

def prefixed(tensors: Mapping[str, np.ndarray], prefix: str, outside: tuple[str, ...]) -> dict[str, np.ndarray]:
    """`tensors` with every name under `prefix` (ending in "."), as the full model has them, but those
    starting with one of `outside` (the heads'): a bare backbone's checkpoint leaves the prefix out."""
    return {name if name.startswith((prefix, *outside)) else prefix + name: value for name, value in tensors.items()}


def fold_copies(tensors: Mapping[str, np.ndarray], tied: Mapping[str, str], model: str) -> dict[str, np.ndarray]:
    """`tensors` without the tied copies of `tied` (copy name -> source name): a copy must equal its
    source, and stands for it where the checkpoint lacks the source."""
    tensors = dict(tensors)
    for copy, source in tied.items():
        if copy not in tensors:
            continue
        value = tensors.pop(copy)
        if source not in tensors:
            tensors[source] = value
        elif not np.array_equal(value, tensors[source]):
            raise ValueError(f"{copy} differs from {source}: jaxlm {model} ties them, so this checkpoint "
                             "cannot be represented")
    return tensors


def has_group(tensors: Mapping[str, np.ndarray], entries: Sequence[Entry]) -> bool:
    return any(entry.theirs in tensors for entry in entries)


def params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, groups: Mapping[str, Sequence[Entry]],
                   shapes: Mapping[str, tuple[int, ...]], model: str, *, tied: Mapping[str, str] | None = None,
                   ignored: tuple[str, ...] = ()) -> dict:
    """Our float32 tree (scan layout when `config.scan_layers`) from Hugging Face tensors through the name
    map `groups`, our parameters having `shapes`. Tied copies are folded first (:func:`fold_copies`).
    Raises ValueError listing every unexpected tensor (except names ending in `ignored`), every missing
    one and every one whose shape does not fit the config."""
    tensors = fold_copies(tensors, tied or {}, model)
    first, *optional = groups
    present = [first] + [group for group in optional if has_group(tensors, groups[group])]
    entries = [entry for group in present for entry in groups[group]]
    known = {entry.theirs for group in groups.values() for entry in group}
    problems = []
    unknown = sorted(name for name in tensors if name not in known and not name.endswith(ignored))
    if unknown:
        problems.append(f"{len(unknown)} unexpected (jaxlm {model} has no place for them): {listed(unknown)}")
    missing = [entry.theirs for entry in entries if entry.theirs not in tensors]
    if missing:
        problems.append(f"{len(missing)} missing: {listed(missing)}")
    wrong = []
    for entry in entries:
        if entry.theirs not in tensors:
            continue
        want, got = hf_shape(entry, shapes, config), tuple(np.shape(tensors[entry.theirs]))
        if got != want:
            wrong.append(f"{entry.theirs} -> {', '.join(entry.paths)}: expected {want}, got {got}")
    if wrong:
        problems.append(f"{len(wrong)} with the wrong shape for the config: {listed(wrong)}")
    if problems:
        fix = ("; config.json does not describe these weights: convert the directory where the model was saved, its "
               "config and weights together" if missing or wrong else "")
        raise ValueError(f"checkpoint does not fit jaxlm {model}: " + " | ".join(problems) + fix)
    flat = {}
    for entry in entries:
        values = KINDS[entry.kind][0](np.asarray(tensors[entry.theirs], np.float32), config)
        flat.update({path: np.ascontiguousarray(value) for path, value in zip(entry.paths, values)})
    tree = unflatten(flat)
    return stack_layers(tree) if config.scan_layers else tree


# ---------------------------------------------------------------- ours -> Hugging Face

def params_to_hf(params: Mapping, config: TransformerConfig, groups: Mapping[str, Sequence[Entry]],
                 shapes: Mapping[str, tuple[int, ...]], model: str, *,
                 tied: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Hugging Face tensors from our tree (boxed or plain, with or without `params`, scan layout when
    `config.scan_layers`) through the name map `groups`, with a copy of its source for each name in `tied`
    (copy name -> source name) whose source is written. Raises ValueError listing every unexpected,
    missing and wrongly shaped parameter."""
    tree = plain(params)
    if config.scan_layers:
        tree = unstack_layers(tree)
    flat = {path: np.asarray(value, np.float32) for path, value in flatten(tree)}
    first, *optional = groups
    present = [first] + [group for group in optional
                         if any(path in flat for entry in groups[group] for path in entry.paths)]
    entries = [entry for group in present for entry in groups[group]]
    unknown = sorted(set(flat) - {path for group in groups.values() for entry in group for path in entry.paths})
    missing = [path for entry in entries for path in entry.paths if path not in flat]
    wrong = [f"{path}: expected {shapes[path]}, got {flat[path].shape}" for path in sorted(set(flat) & set(shapes))
             if flat[path].shape != shapes[path]]
    if unknown or missing or wrong:
        raise ValueError(f"parameters do not fit jaxlm {model} with this config: "
                         f"unexpected: {listed(unknown) or 'none'} | missing: {listed(missing) or 'none'} | "
                         f"wrong shape: {listed(wrong) or 'none'}")
    tensors = {entry.theirs: np.ascontiguousarray(KINDS[entry.kind][1]([flat[p] for p in entry.paths], config))
               for entry in entries}
    tensors.update({copy: tensors[source].copy() for copy, source in (tied or {}).items() if source in tensors})
    return tensors
