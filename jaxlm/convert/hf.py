"""Hugging Face BERT checkpoints <-> jaxlm BERT: config, tensor names, layouts and shape checks.

Parameter trees here are plain nested dicts of float32 numpy arrays laid out like the ``params``
collection of :class:`jaxlm.models.heads.BertForPreTraining` (``encoder``, ``mlm``, ``nsp``);
``tree["encoder"]`` is the ``params`` collection of :class:`jaxlm.models.encoder.BertEncoder`.
The pooler, the masked-LM head and the next-sentence head are optional groups: a checkpoint
either has all of a group's tensors or none, and a missing group is left out of the tree
(see :func:`missing_groups` and :func:`fill_missing`).
"""
from __future__ import annotations

import dataclasses

import json
import pathlib
from typing import Iterator, Mapping

import numpy as np

from jaxlm.models.config import TransformerConfig
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
MAX_LISTED = 8


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
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(
            f"hidden_act={config['hidden_act']!r} is not supported: jaxlm BERT uses exact (erf) 'gelu'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"position_embedding_type={config['position_embedding_type']!r} is not supported: "
            "jaxlm BERT uses 'absolute' learned positions")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ValueError("decoder/cross-attention BERT configs are not supported")


def bert_config_from_hf(config: Mapping, **overrides) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face BERT config.json dict; `overrides` win (e.g. dtype)."""
    check_bert_config(config)
    fields = {ours: config[theirs] for theirs, ours in CONFIG_FIELDS.items() if theirs in config}
    result = model_config(**{"family": "bert", **fields, **overrides})
    result.validate()
    return result


def check_representable(config: TransformerConfig, family: str, *, grouped_kv: bool = False, **required) -> None:
    """Raise unless `config` has each `required` field value, which `family`'s Hugging Face config implies."""
    wrong = [f"{name}={getattr(config, name)!r} (needs {value!r})" for name, value in required.items()
             if getattr(config, name) != value]
    if config.head_dim * config.num_heads != config.hidden_size:
        wrong.append(f"head_size={config.head_size} (needs hidden_size / num_heads)")
    if not grouped_kv and config.kv_heads != config.num_heads:
        wrong.append(f"num_kv_heads={config.num_kv_heads} (needs num_heads)")
    if wrong:
        raise ValueError(f"this {config.family} model cannot be written as a Hugging Face {family} config: "
                         + "; ".join(wrong))


def bert_config_to_hf(config: TransformerConfig) -> dict:
    """A Hugging Face BERT config.json dict (BertForPreTraining) describing `config`."""
    check_representable(config, "BERT", norm="layernorm", activation="gelu", position_embedding="learned",
                        position_offset=0, use_bias=True, tie_embeddings=True, embedding_size=0)
    fields = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    return {"model_type": "bert", "architectures": ["BertForPreTraining"], **fields, "hidden_act": "gelu",
            "position_embedding_type": "absolute", "pad_token_id": config.pad_token_id, "tie_word_embeddings": True}


def check_family(config: Mapping, model_type: str, family: str) -> None:
    """Raise when config.json names another architecture than `family` (e.g. "Roberta")."""
    found, names = config.get("model_type"), config.get("architectures") or []
    wrong = [n for n in names if not n.startswith(family)] or ([found] if found not in (None, model_type) else [])
    if wrong:
        raise ValueError(f"checkpoint architecture {wrong[0]!r} is not a {family} model")


def build_config(fields: dict, overrides: dict) -> TransformerConfig:
    """A validated TransformerConfig from converted fields; `overrides` win."""
    result = model_config(**{**fields, **overrides})
    result.validate()
    return result


def read_config(model_dir) -> dict:
    path = pathlib.Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no Hugging Face config.json at {path}")
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- reading tensors

def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    import safetensors.numpy

    try:
        return safetensors.numpy.load_file(str(path))
    except TypeError:
        import safetensors.flax

        return {k: np.asarray(v.astype("float32")) for k, v in safetensors.flax.load_file(str(path)).items()}


def _read_torch_bin(path: pathlib.Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as err:
        raise ImportError(
            f"{path} is a PyTorch checkpoint and reading it needs torch; install torch or convert "
            "the checkpoint to model.safetensors") from err
    state = torch.load(str(path), map_location="cpu", weights_only=True)
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


# ---------------------------------------------------------------- name and layout map

def _dense(ours: str, theirs: str, kind: str = "linear") -> list[tuple[str, str, str]]:
    bias_kind = "heads_bias" if kind == "heads_in" else "copy"
    return [(f"{ours}/kernel", f"{theirs}.weight", kind), (f"{ours}/bias", f"{theirs}.bias", bias_kind)]


def _norm(ours: str, theirs: str) -> list[tuple[str, str, str]]:
    return [(f"{ours}/scale", f"{theirs}.weight", "copy"), (f"{ours}/bias", f"{theirs}.bias", "copy")]


BERT_LAYER_NAMES = ("attention.self.query", "attention.self.key", "attention.self.value",
                    "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense", "output.dense",
                    "output.LayerNorm")


def encoder_layer(i: int, prefix: str, names: tuple[str, ...] = BERT_LAYER_NAMES) -> list[tuple[str, str, str]]:
    """Name map of our post-LN encoder layer i; `names` are the HF sub-modules in the order
    query, key, value, attention output, attention norm, MLP in, MLP out, MLP norm."""
    ours, theirs = f"encoder/layer_{i}", f"{prefix}.{i}"
    query, key, value, out, attention_norm, intermediate, output, mlp_norm = (f"{theirs}.{n}" for n in names)
    return [
        *_dense(f"{ours}/attention/query", query, "heads_in"),
        *_dense(f"{ours}/attention/key", key, "heads_in"),
        *_dense(f"{ours}/attention/value", value, "heads_in"),
        *_dense(f"{ours}/attention/output", out, "heads_out"),
        *_norm(f"{ours}/attention_norm", attention_norm),
        *_dense(f"{ours}/mlp/intermediate", intermediate),
        *_dense(f"{ours}/mlp/output", output),
        *_norm(f"{ours}/mlp_norm", mlp_norm),
    ]


def name_map(config: TransformerConfig) -> dict[str, list[tuple[str, str, str]]]:
    """Group -> [(our '/'-joined path, HF BertForPreTraining name, layout kind)]."""
    embeddings = [
        ("encoder/embeddings/word/embedding", "bert.embeddings.word_embeddings.weight", "copy"),
        ("encoder/embeddings/position/embedding", "bert.embeddings.position_embeddings.weight", "copy"),
        ("encoder/embeddings/token_type/embedding", "bert.embeddings.token_type_embeddings.weight", "copy"),
        *_norm("encoder/embeddings/norm", "bert.embeddings.LayerNorm"),
    ]
    return {
        "encoder": embeddings + [entry for i in range(config.num_layers) for entry in encoder_layer(i, "bert.encoder.layer")],
        "pooler": _dense("encoder/pooler", "bert.pooler.dense"),
        "mlm": [("mlm/bias", "cls.predictions.bias", "copy"),
                *_dense("mlm/transform", "cls.predictions.transform.dense"),
                *_norm("mlm/norm", "cls.predictions.transform.LayerNorm")],
        "nsp": _dense("nsp", "cls.seq_relationship"),
    }


def to_ours(kind: str, x, config: TransformerConfig):
    """One HF tensor in our layout: torch Linear [out, in] -> [in, out], heads split out."""
    heads, e = (config.num_heads, config.head_dim), config.hidden_size
    if kind == "linear":
        return x.T
    if kind == "heads_in":
        return x.T.reshape(e, *heads)
    if kind == "heads_bias":
        return x.reshape(heads)
    if kind == "heads_out":
        return x.T.reshape(*heads, e)
    return x


def to_hf(kind: str, x, config: TransformerConfig):
    """The inverse of :func:`to_ours`."""
    e = config.hidden_size
    if kind == "linear":
        return x.T
    if kind == "heads_in":
        return x.reshape(e, -1).T
    if kind == "heads_bias":
        return x.reshape(-1)
    if kind == "heads_out":
        return x.reshape(-1, e).T
    return x


# ---------------------------------------------------------------- our tree

def param_shapes(module_cls, config: TransformerConfig, num_inputs: int) -> dict[str, tuple[int, ...]]:
    """'/'-joined loop-layout path -> shape of every parameter `module_cls(config)` creates when
    initialised on `num_inputs` [1, 1] id arrays (no allocation)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    model = module_cls(dataclasses.replace(config, scan_layers=False, remat="none"))
    ids = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.PRNGKey(0), *[ids] * num_inputs)))["params"]
    return {"/".join(p.key for p in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}


def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of our BertForPreTraining (no allocation)."""
    from jaxlm.models.heads import BertForPreTraining

    return param_shapes(BertForPreTraining, config, 4)


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


def _hf_shape(kind: str, shape: tuple[int, ...], config: TransformerConfig) -> tuple[int, ...]:
    return tuple(to_hf(kind, np.empty(shape, np.float32), config).shape)


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return "; ".join(items[:MAX_LISTED]) + more


# ---------------------------------------------------------------- HF -> ours

def normalize_names(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF BertForPreTraining names: a `bert.` prefix on the backbone, LayerNorm gamma/beta renamed."""
    out = {}
    for name, value in tensors.items():
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if not name.startswith(("bert.", "cls.")):
            name = f"bert.{name}"
        out[name] = value
    return out


def _check_tied(tensors: Mapping[str, np.ndarray]) -> None:
    pairs = ((TIED_DECODER, "bert.embeddings.word_embeddings.weight"), (TIED_DECODER_BIAS, "cls.predictions.bias"))
    for tied, source in pairs:
        if tied in tensors and source in tensors and not np.array_equal(tensors[tied], tensors[source]):
            raise ValueError(f"{tied} differs from {source}: jaxlm BERT ties them, so this checkpoint "
                             "cannot be represented")


def _present_groups(tensors: Mapping[str, np.ndarray], groups: dict) -> list[str]:
    present = []
    for group, entries in groups.items():
        missing = [theirs for _, theirs, _ in entries if theirs not in tensors]
        if group == "encoder" or len(missing) < len(entries):
            if missing:
                raise ValueError(f"checkpoint has part of the {group} tensors; missing: {_listed(missing)}")
            present.append(group)
    return present


def _check_shapes(tensors, entries, shapes, config) -> None:
    wrong = []
    for ours, theirs, kind in entries:
        want = _hf_shape(kind, shapes[ours], config)
        got = tuple(np.shape(tensors[theirs]))
        if got != want:
            wrong.append(f"{theirs} -> {ours}: ours {want} vs theirs {got}")
    if wrong:
        raise ValueError(f"checkpoint does not fit the config ({len(wrong)} shape mismatches): {_listed(wrong)}")


def bert_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, *,
                        require_heads: bool = False) -> dict:
    """Our parameter tree from HF BERT tensors (names with or without `bert.`).

    Optional groups (pooler, MLM head, NSP head) absent from the checkpoint are left out of the
    tree; with `require_heads` a missing MLM or NSP head raises instead.
    """
    tensors = normalize_names(tensors)
    _check_tied(tensors)
    groups = name_map(config)
    known = {theirs for entries in groups.values() for _, theirs, _ in entries}
    unknown = sorted(n for n in tensors
                     if n not in known and n not in (TIED_DECODER, TIED_DECODER_BIAS)
                     and not n.removeprefix("bert.").startswith(BUFFERS))
    if unknown:
        raise ValueError(f"checkpoint tensors jaxlm BERT has no place for: {_listed(unknown)}")
    present = _present_groups(tensors, groups)
    absent_heads = [g for g in ("mlm", "nsp") if g not in present]
    if require_heads and absent_heads:
        raise ValueError(f"checkpoint has no {' or '.join(absent_heads)} head (require_heads=True)")
    entries = [entry for group in present for entry in groups[group]]
    _check_shapes(tensors, entries, expected_shapes(config), config)
    return unflatten({ours: np.asarray(to_ours(kind, np.asarray(tensors[theirs], np.float32), config))
                      for ours, theirs, kind in entries})


def missing_groups(params: Mapping, config: TransformerConfig) -> list[str]:
    """The optional groups (pooler, mlm, nsp) that a converted tree lacks."""
    paths = dict(flatten(params))
    return [g for g in OPTIONAL_GROUPS if name_map(config)[g][0][0] not in paths]


def fill_missing(params: Mapping, defaults: Mapping) -> dict:
    """`params` completed with the leaves only `defaults` (e.g. a fresh init) has."""
    return unflatten({**dict(flatten(defaults)), **dict(flatten(params))})


def load_hf_bert(model_dir, *, require_heads: bool = False, **config_overrides) -> tuple[TransformerConfig, dict]:
    """(config, parameter tree) of a Hugging Face BERT checkpoint directory."""
    config = bert_config_from_hf(read_config(model_dir), **config_overrides)
    return config, bert_params_from_hf(read_tensors(model_dir), config, require_heads=require_heads)


# ---------------------------------------------------------------- ours -> HF

def _plain(params: Mapping) -> Mapping:
    import flax.linen as nn

    params = nn.unbox(params)
    return params["params"] if "params" in params else params


def bert_params_to_hf(params: Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF BertForPreTraining tensors from our tree (boxed or plain, with or without `params`),
    including the tied `cls.predictions.decoder.*` copies when the MLM head is present."""
    flat = {path: np.asarray(value, np.float32) for path, value in flatten(_plain(params))}
    groups = name_map(config)
    known = {ours for entries in groups.values() for ours, _, _ in entries}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ValueError(f"parameters with no Hugging Face BERT name: {_listed(unknown)}")
    tensors = {theirs: np.ascontiguousarray(to_hf(kind, flat[ours], config))
               for entries in groups.values() for ours, theirs, kind in entries if ours in flat}
    if "cls.predictions.bias" in tensors:
        tensors[TIED_DECODER] = tensors["bert.embeddings.word_embeddings.weight"].copy()
        tensors[TIED_DECODER_BIAS] = tensors["cls.predictions.bias"].copy()
    return tensors
