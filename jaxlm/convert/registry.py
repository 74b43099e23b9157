"""Conversion of whole models to and from Hugging Face (and GGUF), for the families jaxlm.families gives a converter."""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Mapping

import flax.linen as nn
import jax
import numpy as np

from jaxlm import families
from jaxlm.convert import gguf
from jaxlm.convert.hf import read_config, read_tensors
from jaxlm.convert.layout import stack_layers, unstack_layers
from jaxlm.convert.names import flatten, listed, plain, unflatten
from jaxlm.corpora.models import PACKAGED_GGUF, PACKAGED_MODELS, local_or_packaged
from jaxlm.data.settings import DataConfig
from jaxlm.errors import first_line
from jaxlm.models.config import TransformerConfig, check_vocab_multiple


def convertible() -> list[str]:
    return [name for name, family in families.FAMILIES.items() if family.converters]


def family_for_hf(hf_config: Mapping) -> families.Family:
    """The family of a Hugging Face config.json dict, by its `model_type`."""
    model_type = hf_config.get("model_type")
    if model_type not in convertible():
        raise ValueError(f"model_type={model_type!r} in config.json is not supported; supported model types: "
                         f"{', '.join(convertible())}")
    return families.get(model_type)


def family_of(config: TransformerConfig) -> families.Family:
    if config.family not in convertible():
        raise ValueError(f"model family {config.family!r} has no Hugging Face converter; supported: "
                         f"{', '.join(convertible())}")
    return families.get(config.family)


TASK_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")


def config_from_hf(model_dir, hf_config: Mapping | None = None, **overrides) -> TransformerConfig:
    """The config of a Hugging Face checkpoint directory (its config.json, or `hf_config` as read from it),
    checked; a fine-tuned one's too."""
    hf_config = read_config(model_dir) if hf_config is None else hf_config
    try:
        return family_for_hf(hf_config).converter("config_from_hf")(hf_config, **overrides)
    except TypeError as err:  # a size given as null (or a list) where the converter computes with it
        raise ValueError(f"{pathlib.Path(model_dir) / 'config.json'}: a setting is not a number ({first_line(err)}); "
                         "give sizes and rates as JSON numbers") from None


def from_hf(model_dir, *, scan_layers: bool = False, vocab_multiple: int = 1,
            **overrides) -> tuple[TransformerConfig, dict]:
    """(config, parameter tree) of a Hugging Face checkpoint directory; the config is checked before
    any tensor is read. With `scan_layers` the tree has the stacked (scan) layer layout; with `vocab_multiple`
    the token tables are padded (`padded_vocab`). A fine-tuned checkpoint (a task head) is refused, naming
    `jaxlm.convert.task_heads`, which reads it. `model_dir` may name a packaged model (`PACKAGED_MODELS`), as the
    command's may."""
    model_dir = local_or_packaged(model_dir, PACKAGED_MODELS)
    hf_config = read_config(model_dir)
    config = config_from_hf(model_dir, hf_config, **overrides)
    fine_tuned = [name for name in hf_config.get("architectures") or [] if str(name).endswith(TASK_HEADS)]
    if fine_tuned:  # its head's tensors were listed as unexpected, under names it does not have
        reader = ("read it with jaxlm.convert.task_heads.task_params_from_hf(read_tensors(dir), config_from_hf(dir), "
                  "head)" if families.get(config.family).backbone else f"jaxlm reads no fine-tuned {config.family} "
                  "head; convert the base model it was tuned from")
        raise ValueError(f"{model_dir} holds a fine-tuned {fine_tuned[0]}, whose task head from_hf has no place for; "
                         + reader)
    check_vocab_padding(config.vocab_size, vocab_multiple)
    family = families.get(config.family)
    params = family.converter("params_from_hf")(read_tensors(model_dir), config)
    config, params = padded_vocab(config, params, vocab_multiple)
    return scan_layout(config, params) if scan_layers else (config, params)


def from_gguf(path, *, scan_layers: bool = False, vocab_multiple: int = 1,
              **overrides) -> tuple[TransformerConfig, dict, dict[str, str]]:
    """(config, parameter tree, tokenizer files by name) of a llama.cpp GGUF file, via jaxlm.convert.gguf; its
    metadata and tokenizer are checked before any tensor is dequantised. `path` may name a packaged model
    (`PACKAGED_GGUF`)."""
    check_vocab_multiple(vocab_multiple, "--vocab-multiple")
    reader = gguf.open_gguf(local_or_packaged(path, PACKAGED_GGUF))
    vocab_size = gguf.hf_llama_config(reader)["vocab_size"]
    tokenizer = gguf.gguf_tokenizer(reader)
    check_vocab_padding(vocab_size, vocab_multiple)
    config, params, info = gguf.load_gguf(reader, **overrides)
    config, params = padded_vocab(config, params, vocab_multiple)
    settings = {f"{kind}_token": tokenizer.id_to_token(info[f"{kind}_token_id"])
                for kind in ("bos", "eos") if info.get(f"{kind}_token_id") is not None}
    if info.get("chat_template"):
        settings["chat_template"] = info["chat_template"]
    files = {"tokenizer.json": tokenizer.to_str(),
             "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **settings}, indent=2)}
    config, params = scan_layout(config, params) if scan_layers else (config, params)
    return config, params, files


def check_vocab_padding(vocab_size: int, multiple: int) -> None:
    """A --vocab-multiple of 1 or more, and at most the vocabulary: a larger one pads in more rows than it has."""
    check_vocab_multiple(multiple, "--vocab-multiple")
    if multiple > vocab_size:
        raise ValueError(f"--vocab-multiple={multiple} is larger than the vocabulary it pads ({vocab_size:,} tokens); "
                         "use a row multiple such as 64 or 128")


def _network_leaves(config: TransformerConfig) -> list[tuple[str, nn.Partitioned]]:
    """('/'-joined path, abstract boxed parameter) of each parameter of the family's pretraining network."""
    objective = families.make_objective(config, DataConfig(max_seq_length=16, max_predictions=2))
    boxed = jax.eval_shape(objective.init, jax.random.key(0))
    leaves = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
    return [("/".join(part.key for part in path), leaf) for path, leaf in leaves if isinstance(leaf, nn.Partitioned)]


def vocab_axes(config: TransformerConfig) -> dict[str, int]:
    """'/'-joined path -> vocabulary axis of each parameter that the family's pretraining network splits over
    "vocab": token tables, output projections and their biases."""
    return {path: leaf.names.index("vocab") for path, leaf in _network_leaves(config) if "vocab" in leaf.names}


def check_shapes(config: TransformerConfig, params: Mapping, where: str) -> None:
    """ValueError naming the parameters whose shape is not the one `config` gives them (a config edited by hand);
    parameters its pretraining network lacks (a fine-tuned head) are left alone."""
    wanted = {path: tuple(leaf.value.shape) for path, leaf in _network_leaves(config)}
    stored = {path: np.shape(value) for path, value in flatten(plain(params))}
    wrong = [f"{path} is {stored[path]}, not {wanted[path]}" for path in sorted(set(stored) & set(wanted))
             if stored[path] != wanted[path]]
    if wrong:
        raise ValueError(f"{where}: its parameters do not fit the model config stored with them (edited by hand?): "
                         f"{listed(wrong)}; give the checkpoint the config it was written with")


def padded_vocab(config: TransformerConfig, params: Mapping, multiple: int) -> tuple[TransformerConfig, dict]:
    """(config, params) with `vocab_multiple=multiple`: every vocabulary axis cut or zero-padded to the new
    `padded_vocab_size` rows. multiple=1 strips the padding, as Hugging Face and GGUF files have none; the
    model's outputs are the same either way (the padding's logits are dropped)."""
    if multiple == config.vocab_multiple:
        return config, dict(params)
    resized = dataclasses.replace(config, vocab_multiple=multiple)
    rows, axes = resized.padded_vocab_size, vocab_axes(config)
    flat = dict(flatten(plain(params)))
    for path, axis in axes.items():
        if path in flat:
            value = np.asarray(flat[path]).take(np.arange(config.vocab_size), axis=axis)
            widths = [(0, 0)] * value.ndim
            widths[axis] = (0, rows - value.shape[axis])
            flat[path] = np.pad(value, widths)
    return resized, unflatten(flat)


def scan_layout(config: TransformerConfig, params: Mapping) -> tuple[TransformerConfig, dict]:
    """(config, params) with one stacked `layers` subtree per layer stack, as `scan_layers` wants."""
    if config.scan_layers:
        return config, dict(params)
    return dataclasses.replace(config, scan_layers=True), stack_layers(params)


def loop_layout(config: TransformerConfig, params: Mapping) -> tuple[TransformerConfig, dict]:
    """(config, params) with the layer_0..N-1 layout the converters expect."""
    if not config.scan_layers:
        return config, dict(params)
    return dataclasses.replace(config, scan_layers=False), unstack_layers(params)


def to_hf(config: TransformerConfig, params: Mapping) -> tuple[dict, dict, str]:
    """(config.json dict, tensors by Hugging Face name, the transformers auto class that loads them)."""
    family = family_of(config)
    config, params = loop_layout(config, params)
    config, params = padded_vocab(config, params, 1)
    hf_config = family.converter("config_to_hf")(config)
    tensors = family.converter("params_to_hf")(params, config)
    auto_class = family.auto_class
    if family.hf_backbone and any(head not in params for head in family.hf_heads):
        hf_config["architectures"], auto_class = [family.hf_backbone], "AutoModel"
    return {**hf_config, "dtype": "float32"}, tensors, auto_class
