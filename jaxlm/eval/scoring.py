"""Log-likelihoods of continuations after contexts, batched in a few bucketed shapes over a device mesh:
the one scoring engine of perplexity and choice tasks, for decoders (next-token likelihood), encoders
(pseudo-log-likelihood: each continuation token masked in turn) and encoder-decoders (target likelihood)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxlm import families
from jaxlm.data.settings import DataConfig
from jaxlm.errors import first_line
from jaxlm.models.config import TransformerConfig, check_ids, check_special_ids
from jaxlm.models.heads import gather_positions
from jaxlm.parallel.mesh import batch_shards, logical_sharding, mesh_and_rules, replicated, tree_shardings
from jaxlm.parallel.xla_options import project_xla_options
from jaxlm.sentence_embedding import position_limit as table_positions

# Sequence lengths are padded up to one of these (capped at the model's positions): few shapes, few compiles.
MIN_BUCKET = 16


ITEM_FIELDS = ("context", "continuation", "suffix")


@dataclasses.dataclass(frozen=True)
class Item:
    """One scored continuation. Decoders read context + continuation left to right; encoders see
    context + continuation + suffix with one continuation token masked at a time; encoder-decoders
    encode the context and decode the continuation. Every id sequence includes the tokenizer's own
    special tokens where it adds them (BOS, [CLS] ... [SEP], </s>)."""

    context: tuple[int, ...]
    continuation: tuple[int, ...]
    suffix: tuple[int, ...] = ()

    def __post_init__(self):  # lists and numpy arrays of ids as tuples (an array's truth value is ambiguous)
        for field in ITEM_FIELDS:
            object.__setattr__(self, field, tuple(getattr(self, field)))

    def record(self) -> dict:
        out = {"context": list(self.context), "continuation": list(self.continuation)}
        return out | ({"suffix": list(self.suffix)} if self.suffix else {})


def kind_of(config: TransformerConfig) -> str:
    """How the family scores: "causal", "masked" or "seq2seq"."""
    if not isinstance(config, TransformerConfig):  # generation takes the network; scoring, its config
        raise ValueError(f"scoring takes the model's config (a TransformerConfig, e.g. model.config), not a "
                         f"{type(config).__name__}")
    return families.get(config.family).scores


def position_limit(config: TransformerConfig) -> int | None:
    """Tokens a sequence may hold (None: relative positions, no limit)."""
    return None if config.position_embedding == "relative" else table_positions(config)


def bucket(length: int, limit: int | None) -> int:
    size = max(MIN_BUCKET, 1 << max(0, length - 1).bit_length())
    return size if limit is None else max(length, min(size, limit))


def least_read(item: Item, kind: str) -> int:
    """Tokens the model must read at once to score `item`, its context cut from the left as far as it
    may be: decoders and encoder-decoders read at least the continuation; encoders also its suffix and
    the context's first token (the tokenizer's [CLS] or <s>)."""
    if kind == "masked":
        return min(len(item.context), 1) + len(item.continuation) + len(item.suffix)
    return len(item.continuation)


def as_items(items) -> list[Item]:
    """Items, each given as an Item or as a tuple of its fields (context, continuation[, suffix])."""
    if isinstance(items, Item):
        raise ValueError("items is one Item; give a list of them")
    try:
        return [item if isinstance(item, Item) else Item(*item) for item in items]
    except TypeError:
        raise ValueError("items must be Item(context, continuation[, suffix]) or tuples of those id "
                         "sequences") from None


def check_fits(items: Sequence[Item], config: TransformerConfig, kind: str) -> None:
    """Raise ValueError for an item the model cannot read at once, or one a decoder would have to
    predict from nothing."""
    if kind == "causal":
        for index, item in enumerate(items):
            if item.continuation and not item.context:
                raise ValueError(f"item {index}: a decoder predicts each token from those before it, and this "
                                 "continuation has no context; begin the context with the tokenizer's BOS "
                                 "(or end-of-text) id")
    limit = position_limit(config)
    if limit is None:
        return
    for index, item in enumerate(items):
        if least_read(item, kind) > limit:
            raise ValueError(f"item {index}: a continuation of {len(item.continuation)} tokens needs "
                             f"{least_read(item, kind)} positions, more than the model's {limit}; shorten it")


def check_vocabulary(items: Sequence[Item], vocab_size: int, label: str = "item") -> None:
    """Raise ValueError naming the first id outside the model's vocabulary ("item 3, context token 0": `label`
    and the item's index; the model's gathers would clamp it)."""
    every = np.asarray([t for item in items for field in ITEM_FIELDS for t in getattr(item, field)])
    if every.size == 0 or (np.issubdtype(every.dtype, np.integer) and every.min() >= 0 and every.max() < vocab_size):
        return
    for index, item in enumerate(items):
        for field in ITEM_FIELDS:
            check_ids(getattr(item, field), vocab_size, lambda at: f"{label} {index}, {field} token {at[0]}")


# ---------------------------------------------------------------- rows: numpy, one batch at a time

def causal_rows(items: Sequence[Item], limit: int | None) -> list[dict]:
    """Input, targets and weights per item: context + continuation shifted by one, the context cut
    from the left where the whole does not fit."""
    rows = []
    for item in items:
        tokens = list(item.context) + list(item.continuation)
        if limit is not None and len(tokens) - 1 > limit:
            tokens = tokens[len(tokens) - 1 - limit:]
        inputs, targets = tokens[:-1], tokens[1:]
        weights = [0.0] * (len(targets) - len(item.continuation)) + [1.0] * len(item.continuation)
        rows.append({"input_ids": inputs, "targets": targets, "weights": weights})
    return rows


def seq2seq_rows(items: Sequence[Item], limit: int | None, start_id: int) -> list[dict]:
    rows = []
    for item in items:
        source = list(item.context)[-limit:] if limit is not None else list(item.context)
        target = list(item.continuation)
        rows.append({"input_ids": source, "decoder_input_ids": [start_id] + target[:-1], "targets": target,
                     "weights": [1.0] * len(target)})
    return rows


def masked_rows(items: Sequence[Item], mask_id: int, limit: int | None) -> list[dict]:
    """One row per continuation token: the whole sequence with that token masked; a context too long
    keeps its first token ([CLS]) and loses what follows it."""
    rows = []
    for item in items:
        context = list(item.context)
        room = None if limit is None else limit - len(item.continuation) - len(item.suffix)
        if room is not None and len(context) > room:
            context = context[:1] + context[len(context) - room + 1:]
        sequence = context + list(item.continuation) + list(item.suffix)
        for offset, token in enumerate(item.continuation):
            position = len(context) + offset
            masked = sequence.copy()
            masked[position] = mask_id
            rows.append({"input_ids": masked, "positions": [position], "targets": [token], "weights": [1.0]})
    return rows


def pad_rows(rows: list[dict], size: int, pad_id: int, limit: int | None) -> dict[str, np.ndarray]:
    """[size, bucket] arrays from up to `size` rows; absent rows weigh nothing."""
    widths = {key: bucket(max(len(r[key]) for r in rows), limit) for key in rows[0]}
    if "positions" in widths:
        widths["positions"] = widths["targets"] = widths["weights"] = 1
    out = {}
    for key, width in widths.items():
        fill = pad_id if key.endswith("input_ids") else 0
        array = np.full((size, width), fill, np.float32 if key == "weights" else np.int32)
        for i, row in enumerate(rows):
            array[i, :len(row[key])] = row[key]
        out[key] = array
    out["input_mask"] = np.zeros(out["input_ids"].shape, np.int32)
    for i, row in enumerate(rows):
        out["input_mask"][i, :len(row["input_ids"])] = 1
    out["input_mask"][len(rows):, 0] = 1  # an absent row holds one pad token: attention needs a key
    return out


# ---------------------------------------------------------------- the compiled scorers

def _masked_logits(module, input_ids, input_mask, positions):
    hidden = module.encoder.hidden_states(input_ids, None, input_mask, True)
    return module.mlm(gather_positions(hidden, positions), module.encoder.word_embeddings)


def _forward(model: nn.Module, kind: str, params, batch: dict) -> jax.Array:
    """Logits at every target of the batch [B, T, V]."""
    variables = {"params": params}
    if kind == "causal":
        mask = batch["input_mask"]
        return model.apply(variables, batch["input_ids"], None, mask, mask > 0, deterministic=True)
    if kind == "seq2seq":
        return model.apply(variables, batch["input_ids"], batch["decoder_input_ids"], batch["input_mask"],
                           deterministic=True)
    return model.apply(variables, batch["input_ids"], batch["input_mask"], batch["positions"],
                       method=_masked_logits)


@functools.lru_cache(maxsize=None)
def compiled_scorer(config: TransformerConfig, mesh: Mesh, rules: tuple) -> Callable:
    """(params, batch) -> weighted target log-probabilities [B, T], replicated. One jitted function per
    model config and mesh, so every checkpoint of a model reuses its compilations."""
    model, kind = families.get(config.family).network(config), kind_of(config)

    def score(params, batch):
        logits = _forward(model, kind, params, batch).astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
        return picked * batch["weights"]

    jitted = jax.jit(score, out_shardings=replicated(mesh),
                     compiler_options=project_xla_options(mesh.devices.flat) or None)

    def run(params, batch):
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            return jitted(params, batch)

    run.jitted = jitted  # its cache holds one compilation per padded shape
    return run


def global_arrays(batch: dict[str, np.ndarray], mesh: Mesh, rules: tuple) -> dict[str, jax.Array]:
    """Host arrays (the same on every process) as arrays sharded over the batch axes."""
    sharding = logical_sharding(mesh, rules, ("batch", None))
    return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index]) for k, v in batch.items()}


def host_value(array: jax.Array) -> np.ndarray:
    """A replicated array on this host, also where other processes hold some of its devices."""
    return np.asarray(array.addressable_data(0))


# ---------------------------------------------------------------- parameters on a mesh

def scoring_init(config: TransformerConfig) -> Callable:
    """rng -> the parameters scoring reads: the whole network, but for encoders only the encoder
    (without its pooler, which BertForMaskedLM checkpoints lack) and the masked-LM head."""
    if kind_of(config) != "masked":
        return families.make_objective(config, DataConfig(max_seq_length=MIN_BUCKET, max_predictions=2)).init
    model, ids = families.get(config.family).network(config), jnp.zeros((1, MIN_BUCKET), jnp.int32)
    return lambda rng: model.init(rng, ids, jnp.ones_like(ids), jnp.zeros((1, 1), jnp.int32),
                                  method=_masked_logits)["params"]


def abstract_params(config: TransformerConfig, mesh: Mesh, rules: tuple):
    """ShapeDtypeStructs of the parameters scoring reads, with their mesh shardings: the target Orbax
    restores into."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(scoring_init(config), jax.random.key(0))
        shardings = tree_shardings(mesh, rules, boxed)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.unbox(boxed), shardings)


def required_groups(config: TransformerConfig) -> list[str]:
    """The top-level parameter groups scoring reads (e.g. encoder, mlm)."""
    return list(jax.eval_shape(scoring_init(config), jax.random.key(0)))


def select_like(tree, target):
    """The part of a nested dict `tree` that `target` has (ValueError naming what it lacks)."""
    if not isinstance(target, dict):
        return tree
    missing = [k for k in target if not isinstance(tree, dict) or k not in tree]
    if missing:
        raise ValueError(f"the parameters lack {', '.join(missing)}")
    return {k: select_like(tree[k], v) for k, v in target.items()}


def place_params(params, config: TransformerConfig, mesh: Mesh, rules: tuple):
    """A caller's parameter tree (numpy or jax arrays, boxed with their axis names or not) on the mesh by its
    logical axes, keeping what scoring reads."""
    kind_of(config)
    target = abstract_params(config, mesh, rules)
    params = nn.unbox(params)
    try:
        chosen = select_like(params, target)
    except ValueError as err:
        nested = isinstance(params, dict) and "params" in params and "params" not in target
        hint = "; give the tree under \"params\", not the variables that hold it" if nested else ""
        raise ValueError(f"{err}, which scoring a {config.family} model needs{hint}") from None
    return jax.tree.map(lambda x, t: jax.device_put(x, t.sharding), chosen, target)


# ---------------------------------------------------------------- scoring

@dataclasses.dataclass
class Scorer:
    """Token log-likelihoods of Items under one model config on one mesh; `batch_size` rows per call
    (rounded up to the mesh's batch shards; fewer, a power of two, where a call has fewer rows). `pad_id`
    defaults to the config's; encoders need `mask_id`, encoder-decoders use the config's decoder start id."""

    config: TransformerConfig
    mesh: Mesh
    rules: tuple = ()
    batch_size: int = 32
    mask_id: int | None = None
    pad_id: int | None = None

    def __post_init__(self):
        self.kind = kind_of(self.config)
        if self.kind == "masked" and self.mask_id is None:
            raise ValueError(f"pseudo-log-likelihood under a {self.config.family} encoder masks each continuation "
                             "token: it needs mask_id, the tokenizer's mask token, and none was given (or the "
                             "tokenizer has none)")
        check_special_ids(self.config.vocab_size, mask_id=self.mask_id, pad_id=self.pad_id)
        self.shards = shards = batch_shards(self.mesh, self.rules)
        self.batch_size = max(shards, -(-self.batch_size // shards) * shards)
        self.limit = position_limit(self.config)
        self.pad = self.config.pad_token_id if self.pad_id is None else self.pad_id
        self.score_fn = compiled_scorer(self.config, self.mesh, tuple(self.rules))

    def rows(self, items: Sequence[Item]) -> list[dict]:
        if self.kind == "causal":
            return causal_rows(items, self.limit)
        if self.kind == "seq2seq":
            return seq2seq_rows(items, self.limit, self.config.decoder_start_token_id)
        return masked_rows(items, self.mask_id, self.limit)

    def row_count(self, items: Sequence[Item]) -> int:
        """Rows the items take: one each, or one per continuation token for encoders."""
        return sum(len(i.continuation) for i in items) if self.kind == "masked" else len(items)

    def __call__(self, params, items: Sequence[Item], progress: Callable[[int], None] | None = None
                 ) -> list[np.ndarray]:
        """Per item, the log-probability of each continuation token (float32 [len(continuation)]);
        `progress` is told how many rows each batch finished."""
        items = as_items(items)
        check_fits(items, self.config, self.kind)
        check_vocabulary(items, self.config.vocab_size)
        rows = self.rows(items)
        order = sorted(range(len(rows)), key=lambda r: -len(rows[r]["input_ids"]))
        per_row: list[np.ndarray] = [np.zeros(0, np.float32)] * len(rows)
        # no wider than the rows (to a power of two: few shapes): a --batch-size of 10**8 was that many rows of padding
        wanted = 1 << max(0, len(rows) - 1).bit_length()
        size = min(self.batch_size, -(-wanted // self.shards) * self.shards)
        for start in range(0, len(order), size):
            chosen = order[start:start + size]
            batch = pad_rows([rows[r] for r in chosen], size, self.pad, self.limit)
            try:
                scores = host_value(self.score_fn(params, global_arrays(batch, self.mesh, self.rules)))
            except jax.errors.JaxRuntimeError as err:
                if "RESOURCE_EXHAUSTED" not in str(err):
                    raise
                length = max(array.shape[-1] for array in batch.values())
                raise ValueError(f"{len(chosen)} row(s) of up to {length} tokens need more memory than "
                                 f"the device has ({first_line(err)}); give a smaller --batch-size, or shorter lines "
                                 "and texts") from None
            for slot, r in enumerate(chosen):
                per_row[r] = scores[slot][batch["weights"][slot] > 0]
            if progress is not None:
                progress(len(chosen))
        if self.kind != "masked":
            return per_row
        bounds = np.cumsum([0] + [len(i.continuation) for i in items])
        return [np.concatenate(per_row[a:b] or [np.zeros(0, np.float32)]) for a, b in zip(bounds[:-1], bounds[1:])]


def loglikelihoods(config: TransformerConfig, params, items: Sequence[Item], *, mesh: Mesh | None = None,
                   rules: tuple | None = None, batch_size: int = 32, mask_id: int | None = None) -> np.ndarray:
    """Summed log-likelihood of each item's continuation (float64 [len(items)]): for decoders and
    encoder-decoders the exact likelihood, for encoders the pseudo-log-likelihood. `params` is the
    model's tree as the caller holds it; it is placed on `mesh` by `rules` (defaults: every device,
    data-parallel)."""
    mesh, rules = mesh_and_rules(mesh, rules)
    placed = place_params(params, config, mesh, rules)
    scorer = Scorer(config, mesh, rules, batch_size, mask_id)
    return np.array([float(np.sum(s, dtype=np.float64)) for s in scorer(placed, items)])
