"""Sentence embeddings from an encoder checkpoint: pooled last-layer states, batched over a data mesh."""
from __future__ import annotations

import math
import pathlib
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxlm import families
from jaxlm.convert import store
from jaxlm.corpora.text import check_file, check_output_file, check_plain_text, utf8_lines
from jaxlm.models.config import TransformerConfig, check_ids
from jaxlm.parallel.xla_options import project_xla_options

POOLINGS = ("mean", "cls")
LENGTH_MULTIPLE = 8


def check_encoder(config: TransformerConfig) -> None:
    if config.family not in families.names(embeds=True):
        raise ValueError(f"embed needs an encoder checkpoint ({', '.join(families.names(embeds=True))}), but "
                         f"this one holds a {config.family} model")


def read_sentences(path) -> list[str]:
    """One sentence per line; a blank line is an error (each output row must match an input line)."""
    path = pathlib.Path(path)
    check_file(path, "input file", "give a text file, one sentence per line")
    check_plain_text(path, "input file")
    lines = list(utf8_lines(path))
    blank = [str(i + 1) for i, line in enumerate(lines) if not line.strip()]
    if blank:
        more = f" and {len(blank) - 5} more" if len(blank) > 5 else ""
        raise ValueError(f"{path} has blank lines ({', '.join(blank[:5])}{more}); give one sentence per line "
                         "and remove the blank ones")
    if not lines:
        raise ValueError(f"{path} is empty; give one sentence per line")
    return lines


def position_limit(config: TransformerConfig) -> int:
    return config.max_position_embeddings - config.position_offset


def truncate(ids: list[int], max_length: int) -> list[int]:
    """At most `max_length` ids, keeping the closing special token as Hugging Face truncation does."""
    return ids if len(ids) <= max_length else ids[:max_length - 1] + ids[-1:]


def round_up(n: int, multiple: int) -> int:
    return max(multiple, math.ceil(n / multiple) * multiple)


def pad_batch(rows: Sequence[Sequence[int]], batch: int, length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """[batch, length] ids and real-token mask; rows beyond len(rows) are one pad token each."""
    ids = np.full((batch, length), pad_id, np.int32)
    mask = np.zeros((batch, length), bool)
    mask[len(rows):, 0] = True
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, True
    return ids, mask


def encoder_states(model, input_ids, padding_mask):
    """The encoder's last hidden states [B, T, E], as a `method` of the family's network."""
    return model.encoder.hidden_states(input_ids, None, padding_mask, True)


def encoder_module(config: TransformerConfig):
    """The family's network; only its `encoder.hidden_states` runs, so heads need no parameters."""
    return families.get(config.family).network(config)


def pooled_fn(config: TransformerConfig, pooling: str, normalize: bool) -> Callable:
    """(params, ids [B, T], mask [B, T]) -> pooled float32 [B, E]."""
    module = encoder_module(config)

    def pooled(params, ids, mask):
        hidden = module.apply({"params": params}, ids, mask, method=encoder_states).astype(jnp.float32)
        if pooling == "cls":
            out = hidden[:, 0]
        else:
            weights = mask[..., None].astype(jnp.float32)
            out = (hidden * weights).sum(1) / jnp.maximum(weights.sum(1), 1.0)
        if normalize:
            out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out

    return pooled


def embed(config: TransformerConfig, params, token_ids: Sequence[Sequence[int]], *, pooling: str = "mean",
          normalize: bool = False, batch_size: int = 64, devices=None) -> np.ndarray:
    """[N, hidden] float32 embeddings of N tokenised sentences (already truncated to the positions).

    Sentences are batched by length; each batch is padded to a multiple of the device count (rows)
    and of LENGTH_MULTIPLE (tokens), so few shapes compile, and sharded over a 1-D `data` mesh.
    """
    check_encoder(config)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r}; choose one of {POOLINGS}")
    if not len(token_ids):
        raise ValueError("no sentences to embed")
    for index, row in enumerate(token_ids):  # the encoder's lookup reads an id outside the vocabulary as NaN
        if not len(row):
            raise ValueError(f"sentence {index} has no tokens; every sentence needs at least one")
        check_ids(row, config.vocab_size, lambda at: f"sentence {index}, token {at[0]}")
    longest = max(len(row) for row in token_ids)
    if longest > position_limit(config):
        raise ValueError(f"a sentence has {longest} tokens, more than the model's {position_limit(config)} positions")
    devices = list(jax.devices() if devices is None else devices)
    mesh = Mesh(np.asarray(devices), ("data",))
    rows, replicated = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
    compute = jax.jit(pooled_fn(config, pooling, normalize), in_shardings=(replicated, rows, rows),
                      out_shardings=rows, compiler_options=project_xla_options(devices) or None)
    params = jax.device_put(params, replicated)
    batch = round_up(min(batch_size, len(token_ids)), len(devices))  # no more rows than sentences to pad to
    order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
    out = np.zeros((len(token_ids), config.hidden_size), np.float32)
    for start in range(0, len(order), batch):
        chosen = order[start:start + batch]
        group = [token_ids[i] for i in chosen]
        length = min(round_up(max(map(len, group)), LENGTH_MULTIPLE), position_limit(config))
        ids, mask = pad_batch(group, batch, length, config.pad_token_id)
        out[chosen] = np.asarray(compute(params, ids, mask))[:len(chosen)]
    return out


def embed_file(ckpt, input_path, output=None, *, pooling: str = "mean", normalize: bool = False,
               batch_size: int = 64, max_length: int | None = None, overwrite: bool = False):
    """Embeds each line of `input_path` with checkpoint `ckpt` into a float32 .npy at `output` (default: the
    input path with .npy); every input is checked before the parameters are read. Returns (vectors, output)."""
    if not output and pathlib.Path(input_path).exists() and not pathlib.Path(input_path).is_file():
        raise ValueError(f"--input {input_path} is not a file, so no .npy can lie beside it (/dev/stdin.npy was "
                         "written in /dev); give --output FILE.npy")
    sentences = read_sentences(input_path)
    output = pathlib.Path(output) if output else pathlib.Path(input_path).with_suffix(".npy")
    if output.suffix != ".npy":
        raise ValueError(f"--output {output} must end in .npy")
    check_output_file(output, overwrite, [pathlib.Path(input_path)])
    if batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    config, checkpoint_tokenizer = store.checkpoint_config(ckpt)
    check_encoder(config)
    limit = position_limit(config)
    if max_length is not None and not 2 <= max_length <= limit:
        raise ValueError(f"--max-length {max_length} must lie in [2, {limit}], the model's positions")
    if checkpoint_tokenizer is None:
        raise store.no_tokenizer(ckpt, "the sentences cannot become ids")
    tokenizer = checkpoint_tokenizer.load()
    ids = [truncate(tokenizer.encode(s, add_special_tokens=True), max_length or min(256, limit)) for s in sentences]
    _, params, _ = store.load_checkpoint(ckpt)
    vectors = embed(config, params, ids, pooling=pooling, normalize=normalize, batch_size=batch_size)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial.npy")
    np.save(partial, vectors)
    partial.replace(output)
    return vectors, output
