"""Hugging Face checkpoints: reading config.json and the tensors, helpers every family's config conversion
shares, the BERT-like encoders' naming (:class:`EncoderNames`), and BERT itself.

BERT parameter trees are plain nested dicts of float32 numpy arrays laid out like the ``params``
collection of :class:`jaxlm.models.heads.BertForPreTraining` (``encoder``, ``mlm``, ``nsp``);
``tree["encoder"]`` is the ``params`` collection of :class:`jaxlm.models.encoder.BertEncoder`.
The pooler, the masked-LM head and the next-sentence head are optional groups: a checkpoint
either has all of a group's tensors or none, and a missing group is left out of the tree
(see :func:`missing_groups` and :func:`fill_missing`).
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.flax
import safetensors.numpy

from jaxlm.config import typed_values
from jaxlm.convert.names import (Entry, dense, encoder_layer, flatten, has_group, norm, params_from_hf, params_to_hf,
                                 plain, prefixed, unflatten)
from jaxlm.errors import first_line
from jaxlm.jsonfile import read_json
from jaxlm.models.config import TransformerConfig
from jaxlm.models.heads import BertForPreTraining
from jaxlm.models.presets import model_config

CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps",
    "hidden_dropout_prob": "hidden_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
    "initializer_range": "initializer_range",
}
OPTIONAL_GROUPS = ("pooler", "mlm", "nsp")
TIED_DECODER = "cls.predictions.decoder.weight"
TIED_DECODER_BIAS = "cls.predictions.decoder.bias"
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
SAFETENSORS_PREFIX = "Error while deserializing header: "  # what safetensors says of every unreadable file
BERT_LAYER_NAMES = ("attention.self.query", "attention.self.key", "attention.self.value",
                    "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense",
                    "output.LayerNorm")


# ---------------------------------------------------------------- config

def _architecture_error(name: str) -> ValueError:
    return ValueError(f"checkpoint architecture {name!r} is not supported: only BERT is supported so far")


def check_bert_config(config: Mapping) -> None:
    """Raise ValueError unless a config.json dict describes a BERT our encoder reproduces."""
    model_type = config.get("model_type")
    if model_type is not None and model_type != "bert":
        name = (config.get("architectures") or [model_type])[0]
        raise _architecture_error(name)
    for name in config.get("architectures") or ():
        if not name.startswith("Bert"):
            raise _architecture_error(name)
    check_bert_layers(config, "BERT")


def check_bert_layers(config: Mapping, family: str) -> None:
    """Raise unless a BERT-like config.json dict has BERT's layers: exact GELU, learned absolute positions,
    no decoder or cross-attention."""
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(
            f"hidden_act={config['hidden_act']!r} is not supported: jaxlm {family} uses exact (erf) 'gelu'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"position_embedding_type={config['position_embedding_type']!r} is not supported: "
            f"jaxlm {family} uses 'absolute' learned positions")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ValueError(f"decoder/cross-attention {family} configs are not supported")


def bert_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face BERT config.json dict; `overrides` win (e.g. dtype)."""
    check_bert_config(config)
    fields = {ours: config[theirs] for theirs, ours in CONFIG_FIELDS.items() if theirs in config}
    return build_config({"family": "bert", **fields}, overrides)


def check_representable(config: TransformerConfig, name: str, *, grouped_kv: bool = False,
                         any_head_size: bool = False, **required) -> None:
    """Raise unless `config` has each `required` field value (a tuple: one of its values), as the Hugging
    Face `name` config implies; heads must split hidden_size unless `any_head_size`, and key-value heads
    equal the heads unless `grouped_kv`."""
    wrong = []
    for field, value in required.items():
        allowed = value if isinstance(value, tuple) else (value,)
        if getattr(config, field) not in allowed:
            wrong.append(f"{field}={getattr(config, field)!r} (needs {' or '.join(map(repr, allowed))})")
    if not any_head_size and config.head_dim * config.num_heads != config.hidden_size:
        wrong.append(f"head_size={config.head_size} (needs hidden_size / num_heads)")
    if not grouped_kv and config.kv_heads != config.num_heads:
        wrong.append(f"num_kv_heads={config.num_kv_heads} (needs num_heads)")
    if wrong:
        raise ValueError(f"this {config.family} model cannot be written as a Hugging Face {name} config: "
                         + "; ".join(wrong))


def bert_like_config_to_hf(config: TransformerConfig, family: str, model_type: str, architecture: str,
                           position_offset: int) -> dict:
    """A config.json dict of a BERT-like Hugging Face `architecture` describing `config`."""
    check_representable(config, family, norm="layernorm", activation="gelu", position_embedding="learned",
                        position_offset=position_offset, use_bias=True, tie_embeddings=True, embedding_size=0)
    fields = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    return {"model_type": model_type, "architectures": [architecture], **fields, "hidden_act": "gelu",
            "position_embedding_type": "absolute", "pad_token_id": config.pad_token_id, "tie_word_embeddings": True}


def bert_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face BERT config.json dict (BertForPreTraining) describing `config`."""
    return bert_like_config_to_hf(config, "BERT", "bert", "BertForPreTraining", position_offset=0)


def check_family(config: Mapping, model_type: str, family: str) -> None:
    """Raise when config.json names another architecture than `family` (e.g. "Roberta")."""
    found, names = config.get("model_type"), config.get("architectures") or []
    wrong = [n for n in names if not n.startswith(family)] or ([found] if found not in (None, model_type) else [])
    if wrong:
        raise ValueError(f"checkpoint architecture {wrong[0]!r} is not a {family} model")


def build_config(fields: dict, overrides: dict) -> TransformerConfig:
    """A validated TransformerConfig from converted fields, each of its field's type (64.0 is 64; null refused);
    `overrides` win."""
    return model_config(**{**typed_values(TransformerConfig(), fields, "model"), **overrides})


def special_id(config: Mapping, key: str, default=None):
    """config.json's special token id under `key` (eos_token_id, bos_token_id: the first, where it lists several;
    `default` where it names none), or -1 where it has none; its type is `build_config`'s to check."""
    found = config.get(key, default)
    if isinstance(found, (list, tuple)):
        found = found[0] if found else None
    return -1 if found is None else found


def hf_id(token_id: int) -> int | None:
    """A special token id as config.json writes it: our -1 (none) as null, which `special_id` reads back."""
    return None if token_id < 0 else token_id


def read_config(model_dir) -> dict:
    path = pathlib.Path(model_dir) / "config.json"
    if pathlib.Path(model_dir).is_file():
        raise NotADirectoryError(f"{model_dir} is a file; give the model's directory, which holds config.json and "
                                 "its weights")
    if not path.is_file():
        raise FileNotFoundError(f"no Hugging Face config.json at {path}")
    config = read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object of settings; give the config.json saved with the model")
    quoted = next((f"{key}={value!r}" for key, value in config.items() if isinstance(value, str) and _numeral(value)),
                  None)
    if quoted:
        raise ValueError(f"{path}: {quoted} is a string; write the number without quotes")
    return config


def _numeral(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- reading tensors

def _unreadable_weights(path: pathlib.Path, kind: str, err: Exception) -> ValueError:
    """The one-line error for a weight file its library cannot read: the library's first sentence, the file's size."""
    reason = first_line(err).removeprefix(SAFETENSORS_PREFIX)
    reason = reason.split(". ", 1)[0].rstrip(".")  # torch goes on to explain what a damaged file is
    return ValueError(f"{path} could not be read as a {kind} file ({reason}; {path.stat().st_size} bytes): it is "
                      "truncated or damaged; download or save the model again")


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    try:
        try:
            return safetensors.numpy.load_file(str(path))
        except TypeError:
            return {k: np.asarray(v.astype("float32")) for k, v in safetensors.flax.load_file(str(path)).items()}
    except safetensors.SafetensorError as err:
        raise _unreadable_weights(path, "safetensors", err) from None


def _read_torch_bin(path: pathlib.Path) -> dict[str, np.ndarray]:
    try:
        import torch  # not a dependency: only PyTorch .bin checkpoints need it
    except ImportError:
        raise ValueError(f"{path} is a PyTorch checkpoint and reading it needs torch; install torch "
                         "(pip install torch) or save the model as model.safetensors") from None
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds (RuntimeError, UnpicklingError, EOFError) for a damaged file
        if "Unsupported global" in str(err):  # a sound file holding more than tensors (random bytes: "operand")
            raise ValueError(f"{path} holds objects besides tensors, which torch's safe loader (weights_only) "
                             "refuses; save its state_dict alone, or the model as model.safetensors") from None
        raise _unreadable_weights(path, "PyTorch checkpoint", err) from None
    return {k: v.detach().to(torch.float32 if v.is_floating_point() else v.dtype).numpy()
            for k, v in state.items()}


def checkpoint_files(model_dir) -> list[pathlib.Path]:
    """The weight files of a checkpoint directory (or the file itself): safetensors first."""
    path = pathlib.Path(model_dir)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model.bin in {path}")
    return files


def read_tensors(model_dir) -> dict[str, np.ndarray]:
    """All tensors of a Hugging Face checkpoint (shards merged), by their checkpoint names."""
    tensors: dict[str, np.ndarray] = {}
    for path in checkpoint_files(model_dir):
        read = _read_safetensors if path.suffix == ".safetensors" else _read_torch_bin
        tensors.update(read(path))
    return tensors


# ---------------------------------------------------------------- our tree

def param_shapes(module_cls, config: TransformerConfig, num_inputs: int) -> dict[str, tuple[int, ...]]:
    """'/'-joined loop-layout path -> shape of every parameter `module_cls(config)` creates when
    initialised on `num_inputs` [1, 1] id arrays (no allocation)."""
    model = module_cls(dataclasses.replace(config, scan_layers=False, remat="none"))
    ids = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), *[ids] * num_inputs)))["params"]
    return {"/".join(p.key for p in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}


# ---------------------------------------------------------------- BERT-like encoders

def mlm_head(bias: str, transform: str, transform_norm: str) -> list[Entry]:
    """Our masked-LM head from the Hugging Face names of its output bias, transform and transform norm."""
    return [Entry("mlm/bias", bias), *dense("mlm/transform", transform), *norm("mlm/norm", transform_norm)]


def _current_norm_name(name: str) -> str:
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


@dataclasses.dataclass(frozen=True)
class EncoderNames:
    """How a BERT-like Hugging Face family names its tensors; BERT, RoBERTa, DistilBERT and ALBERT
    differ in nothing else. Groups other than `encoder` (the pooler, the heads) are optional."""

    family: str  # as messages name it
    prefix: str  # of the backbone's tensors, which a bare model's checkpoint leaves out
    heads: Mapping[str, list[Entry]]
    head_prefixes: tuple[str, ...]  # of the head tensors, which take no `prefix`
    tied: Mapping[str, str]  # copy -> source: the decoder weights tied to the word table and the MLM bias
    layers: str = "encoder.layer"
    layer_names: tuple[str, ...] = BERT_LAYER_NAMES
    token_types: bool = True
    pooler: str = "pooler.dense"  # "" where the family has none

    def embeddings(self) -> list[Entry]:
        tables = ("word", "position", "token_type") if self.token_types else ("word", "position")
        return [*(Entry(f"encoder/embeddings/{t}/embedding", f"{self.prefix}.embeddings.{t}_embeddings.weight")
                  for t in tables),
                *norm("encoder/embeddings/norm", f"{self.prefix}.embeddings.LayerNorm")]

    def backbone(self, config: TransformerConfig) -> list[Entry]:
        return self.embeddings() + [
            entry for i in range(config.num_layers)
            for entry in encoder_layer(f"encoder/layer_{i}", f"{self.prefix}.{self.layers}.{i}", self.layer_names)]

    def name_map(self, config: TransformerConfig) -> dict[str, list[Entry]]:
        pooler = {"pooler": dense("encoder/pooler", f"{self.prefix}.{self.pooler}")} if self.pooler else {}
        return {"encoder": self.backbone(config), **pooler, **self.heads}

    def normalize(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Backbone names with `prefix` (a bare model's lack it), old LayerNorm gamma/beta names renamed."""
        renamed = {_current_norm_name(name): value for name, value in tensors.items()}
        return prefixed(renamed, f"{self.prefix}.", self.head_prefixes)

    def params_from_hf(self, tensors: Mapping[str, np.ndarray], config: TransformerConfig,
                       shapes: Mapping[str, tuple[int, ...]], require_heads: bool) -> dict:
        """Our tree, optional groups the checkpoint lacks left out; with `require_heads` a missing head raises."""
        tensors = self.normalize(tensors)
        groups = self.name_map(config)
        absent = [group for group in self.heads if not has_group(tensors, groups[group])]
        if require_heads and absent:
            raise ValueError(f"checkpoint has no {' or '.join(absent)} head (require_heads=True)")
        return params_from_hf(tensors, config, groups, shapes, self.family, tied=self.tied, ignored=BUFFERS)

    def params_to_hf(self, params: Mapping, config: TransformerConfig,
                     shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        """Hugging Face tensors, with the tied copies when the MLM head is there."""
        tied = self.tied if "mlm" in plain(params) else {}
        return params_to_hf(params, config, self.name_map(config), shapes, self.family, tied=tied)


BERT = EncoderNames(
    "BERT", "bert", head_prefixes=("cls.",),
    heads={"mlm": mlm_head("cls.predictions.bias", "cls.predictions.transform.dense",
                           "cls.predictions.transform.LayerNorm"),
           "nsp": dense("nsp", "cls.seq_relationship")},
    tied={TIED_DECODER: "bert.embeddings.word_embeddings.weight", TIED_DECODER_BIAS: "cls.predictions.bias"})


def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our BertForPreTraining (no allocation)."""
    return param_shapes(BertForPreTraining, config, 4)


# ---------------------------------------------------------------- BERT, both ways

def bert_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, *,
                        require_heads: bool = False) -> dict:
    """Our parameter tree from HF BERT tensors (names with or without `bert.`).

    Optional groups (pooler, MLM head, NSP head) absent from the checkpoint are left out of the
    tree; with `require_heads` a missing MLM or NSP head raises instead.
    """
    return BERT.params_from_hf(tensors, config, expected_shapes(config), require_heads)


def bert_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF BertForPreTraining tensors from our tree (boxed or plain, with or without `params`),
    including the tied `cls.predictions.decoder.*` copies when the MLM head is present."""
    return BERT.params_to_hf(params, config, expected_shapes(config))


def missing_groups(params: Mapping, config: TransformerConfig) -> list[str]:
    """The optional groups (pooler, mlm, nsp) that a converted tree lacks."""
    paths = dict(flatten(params))
    return [g for g in OPTIONAL_GROUPS if BERT.name_map(config)[g][0].ours not in paths]


def fill_missing(params: Mapping, defaults: Mapping) -> dict:
    """`params` completed with the leaves only `defaults` (e.g. a fresh init) has."""
    return unflatten({**dict(flatten(defaults)), **dict(flatten(params))})


def load_hf_bert(model_dir, *, require_heads: bool = False, **config_overrides) -> tuple[TransformerConfig, dict]:
    """(config, parameter tree) of a Hugging Face BERT checkpoint directory."""
    config = bert_config_from_hf(read_config(model_dir), **config_overrides)
    return config, bert_params_from_hf(read_tensors(model_dir), config, require_heads=require_heads)
