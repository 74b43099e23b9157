"""The Hugging Face families jaxlm converts: one table, and conversion of whole models in both directions."""
from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Callable, Mapping

from jaxlm.convert.hf import read_config, read_tensors
from jaxlm.convert.layout import stack_layers, unstack_layers
from jaxlm.models.config import TransformerConfig


@dataclasses.dataclass(frozen=True)
class Family:
    """Where one family's converters and module live; imported only when used."""

    name: str
    converters: str
    module: str
    auto_class: str
    # Top-level parameter groups a checkpoint may lack (a bare BertModel has no heads); without them
    # to-hf writes the backbone architecture, which AutoModel loads.
    heads: tuple[str, ...] = ()
    backbone: str = ""

    def function(self, suffix: str) -> Callable:
        return getattr(_import(self.converters, self.name), f"{self.name}_{suffix}")

    @property
    def config_from_hf(self) -> Callable:
        return self.function("config_from_hf")

    @property
    def config_to_hf(self) -> Callable:
        return self.function("config_to_hf")

    @property
    def params_from_hf(self) -> Callable:
        return self.function("params_from_hf")

    @property
    def params_to_hf(self) -> Callable:
        return self.function("params_to_hf")

    @property
    def module_class(self) -> type:
        path, name = self.module.rsplit(".", 1)
        return getattr(_import(path, self.name), name)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bert", "jaxlm.convert.hf", "jaxlm.models.heads.BertForPreTraining", "AutoModelForPreTraining",
           ("mlm", "nsp"), "BertModel"),
    Family("roberta", "jaxlm.convert.hf_encoders", "jaxlm.models.heads.MaskedLM", "AutoModelForMaskedLM",
           ("mlm",), "RobertaModel"),
    Family("distilbert", "jaxlm.convert.hf_encoders", "jaxlm.models.heads.MaskedLM", "AutoModelForMaskedLM",
           ("mlm",), "DistilBertModel"),
    Family("gpt2", "jaxlm.convert.hf_decoder", "jaxlm.models.decoder.CausalLM", "AutoModelForCausalLM"),
    Family("llama", "jaxlm.convert.hf_decoder", "jaxlm.models.decoder.CausalLM", "AutoModelForCausalLM"),
    Family("albert", "jaxlm.convert.hf_albert", "jaxlm.models.albert.AlbertForPreTraining", "AutoModelForPreTraining"),
    Family("t5", "jaxlm.convert.hf_t5", "jaxlm.models.t5.T5ForConditionalGeneration", "AutoModelForSeq2SeqLM"),
    Family("bart", "jaxlm.convert.hf_bart", "jaxlm.models.bart.BartForConditionalGeneration", "AutoModelForSeq2SeqLM"),
)}


def _import(path: str, family: str):
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("jaxlm"):
            raise
        raise ValueError(f"the {family} family is not available in this jaxlm: {err.name} is missing") from err


def family_for_hf(hf_config: Mapping) -> Family:
    """The family of a Hugging Face config.json dict, by its `model_type`."""
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type={model_type!r} in config.json is not supported; supported model types: "
                         f"{', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def family_of(config: TransformerConfig) -> Family:
    if config.family not in FAMILIES:
        raise ValueError(f"model family {config.family!r} has no Hugging Face converter; supported: "
                         f"{', '.join(FAMILIES)}")
    return FAMILIES[config.family]


def from_hf(model_dir, *, scan_layers: bool = False, **overrides) -> tuple[TransformerConfig, dict]:
    """(config, parameter tree) of a Hugging Face checkpoint directory; the config is checked before
    any tensor is read. With `scan_layers` the tree has the stacked (scan) layer layout."""
    hf_config = read_config(model_dir)
    family = family_for_hf(hf_config)
    config = family.config_from_hf(hf_config, **overrides)
    params = family.params_from_hf(read_tensors(model_dir), config)
    return scan_layout(config, params) if scan_layers else (config, params)


def from_gguf(path, *, scan_layers: bool = False, **overrides) -> tuple[TransformerConfig, dict, dict[str, str]]:
    """(config, parameter tree, tokenizer files by name) of a llama.cpp GGUF file, via jaxlm.convert.gguf."""
    gguf = _import("jaxlm.convert.gguf", "gguf")
    try:
        config, params, info = gguf.load_gguf(path, **overrides)
        tokenizer = gguf.gguf_tokenizer(path)
    except ModuleNotFoundError as err:
        raise ValueError(f"reading GGUF files needs the {err.name!r} package; install it") from err
    settings = {f"{kind}_token": tokenizer.id_to_token(info[f"{kind}_token_id"])
                for kind in ("bos", "eos") if info.get(f"{kind}_token_id") is not None}
    if info.get("chat_template"):
        settings["chat_template"] = info["chat_template"]
    files = {"tokenizer.json": tokenizer.to_str(),
             "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **settings}, indent=2)}
    config, params = scan_layout(config, params) if scan_layers else (config, params)
    return config, params, files


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
    hf_config = family.config_to_hf(config)
    tensors = family.params_to_hf(params, config)
    auto_class = family.auto_class
    if family.backbone and any(head not in params for head in family.heads):
        hf_config["architectures"], auto_class = [family.backbone], "AutoModel"
    return {**hf_config, "dtype": "float32"}, tensors, auto_class
