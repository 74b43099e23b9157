"""Run configuration: frozen dataclasses per section, YAML files, dotted overrides, validation."""
from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from typing import Any

import yaml

from jaxlm import families
from jaxlm.corpora.text import check_file
from jaxlm.data.settings import DataConfig, check_data
from jaxlm.models.config import TransformerConfig
from jaxlm.models.presets import PRESETS, model_config
from jaxlm.nn.dropout import HASHED
from jaxlm.parallel.rules import PRESETS as RULES
from jaxlm.train.optim import OPTIMIZERS

NONFINITE = ("stop", "skip")
DISTRIBUTED_ENABLED = ("auto", "true", "false")
# train.dropout_rng -> jax.random.key impl (hash: masks hashed where they are applied, jaxlm.nn.dropout.HASHED)
DROPOUT_RNGS = {"threefry": "threefry2x32", "rbg": "rbg", "hash": HASHED}


class ConfigError(ValueError):
    """A configuration the user must fix; the message says how."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    rules: str = "dp"


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"
    peak_lr: float = 1e-4
    warmup_steps: int = 1000
    end_lr: float = 0.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    clip_norm: float = 1.0
    grad_accum: int = 1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    run_dir: str = "runs/default"
    steps: int = 1000
    global_batch: int = 256
    seed: int = 0
    log_every: int = 10
    eval_every: int = 500
    eval_batches: int = 20
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    init_from: str = ""
    time_limit_minutes: float = 0.0
    nonfinite: str = "stop"  # a step with a non-finite loss or gradient: stop (naming it) or skip its update
    max_skipped: int = 10  # nonfinite=skip: stop after this many non-finite steps in a row
    spike_sigmas: float = 0.0  # nonfinite=skip: also skip a step whose loss is this many std above the window's mean
    spike_window: int = 200  # the recent accepted losses spike_sigmas compares with
    # the step's dropout masks: hash (each hashed from its element's index where it is applied, none kept), threefry
    # or rbg (XLA's RngBitGenerator; each device generates the whole batch's, so it is for one device); each draws
    # other masks, and initialisation keeps jax.random.key(train.seed)
    dropout_rng: str = "hash"
    hang_timeout_s: float = 0.0  # no progress this long: dump stacks, exit 75; 0: 20x the median step, >= 300 s; <0: off
    # where `jaxlm train` keeps its compiled programs for a restart to load: run_dir (<run_dir>/compile-cache),
    # a directory or bucket path, or off; JAX_COMPILATION_CACHE_DIR, when set, wins
    compile_cache: str = "run_dir"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    enabled: str = "auto"
    coordinator: str = ""
    num_processes: int = 0
    process_id: int = -1
    local_device_count: int = 0
    init_timeout_s: float = 300.0  # every process must have started within this
    barrier_timeout_s: float = 600.0  # every process must reach the preflight's meeting points within this


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    steps: int = 20
    warmup: int = 3
    peak_flops_per_device: float = 0.0


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """`jaxlm finetune`: a head (`task`) on a pretrained checkpoint, trained on labelled files."""

    task: str = ""  # a head of jaxlm/finetune/tasks.py; empty: the config is a pretraining one
    init_from: str = ""  # a run directory, one checkpoints/<step> or a `jaxlm convert` output
    train: str = ""  # JSONL, CSV or TSV file, tfds:NAME[/CONFIG][:SPLIT], or a named dataset NAME:SPLIT
    dev: str = ""
    test: str = ""
    fields: dict = dataclasses.field(default_factory=dict)  # the task's role -> the data's field name
    labels: tuple[str, ...] = ()  # the classes or tags; empty: those of the training data
    regression: bool = False  # sequence_classification: one float score, mean squared error
    pooling: str = ""  # sequence and choice heads; empty: the family's own
    loss: str = ""  # sentence_embedding: softmax, cosine or ranking
    crf: bool = False  # token_classification: a linear-chain CRF over the words' first subwords
    max_length: int = 128
    max_span_length: int = 8  # span_labelling: the longest span, in words
    max_target_length: int = 32  # text_to_text and causal_lm responses, in tokens
    prefix: str = ""  # text_to_text: prepended to every source, as T5's task prefixes
    num_beams: int = 1  # text_to_text predictions
    doc_stride: int = 128  # question_answering: tokens shared by consecutive windows of a long context
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    epochs: float = 3.0
    warmup_ratio: float = 0.1  # of all steps; replaces optim.warmup_steps
    schedule: str = "linear"  # linear (warm-up, linear decay) or slanted_triangular (ULMFiT)
    metric: str = ""  # the dev metric that picks the best checkpoint; empty: the task's own
    early_stopping: int = 0  # stop after this many evaluations without a better dev metric; 0: never
    evals_per_epoch: float = 1.0  # held-out evaluations an epoch; below 1 fewer (0.1: every tenth epoch)
    train_layers: int = -1  # -1: every layer; 0: the head only; k: the head and the last k layers
    layer_lr_decay: float = 1.0  # ULMFiT's discriminative rates: each layer down gets this factor
    unfreeze_every: float = 0.0  # ULMFiT's gradual unfreezing: one more layer group every N epochs


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: TransformerConfig = TransformerConfig()
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    distributed: DistributedConfig = DistributedConfig()
    bench: BenchConfig = BenchConfig()
    finetune: FinetuneConfig = FinetuneConfig()


SECTIONS = {f.name: f.type for f in dataclasses.fields(RunConfig)}
SECTION_TYPES = {
    "data": DataConfig, "mesh": MeshConfig, "optim": OptimConfig, "train": TrainConfig,
    "distributed": DistributedConfig, "bench": BenchConfig, "finetune": FinetuneConfig,
}


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
    node[keys[-1]] = value


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2's booleans, true and false: off, on, yes and no stay words (`train.compile_cache: off`
    was read as false, and a cache directory named False made); a key given twice in one mapping is an error (YAML
    kept the last silently: a second `train:` section dropped the first's run_dir)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<: *anchor) may be overridden, and an unhashable key is YAML's own error
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise KeyGivenTwice(problem=f"{key!r} is given twice in one mapping (first on line {seen[key] + 1}), "
                                            "and YAML would keep only the last; merge the two",
                                    problem_mark=key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


class KeyGivenTwice(yaml.constructor.ConstructorError):
    """A mapping that names a key twice."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def read_yaml(text: str):
    return yaml.load(text, Loader=_Loader)


def parse_overrides(overrides: list[str]) -> dict:
    """`a.b=value` strings into a nested dict; values parsed as YAML scalars."""
    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value (e.g. train.steps=100)")
        key, raw = item.split("=", 1)
        try:
            value = read_yaml(raw)
        except KeyGivenTwice as err:
            raise ConfigError(f"override {item!r}: {err.problem}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: {getattr(err, 'problem', None) or 'not YAML'}; give a YAML value "
                              "(a number, a word, [a, b] or {key: value})") from None
        _set_dotted(tree, key.strip(), value)
    return tree


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


INT_LIMIT = 2 ** 31


def _number(value, kind: type, where: str):
    """An int or float field's value; strings such as '1e11' (YAML reads them as text) are parsed."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if kind is int:
        if value != int(value):
            raise ConfigError(f"{where} must be a whole number, got {value!r}")
        if not -INT_LIMIT < value < INT_LIMIT:  # counts, sizes and seeds reach jitted code as int32
            raise ConfigError(f"{where}={int(value)} is too large: a whole number here must lie within "
                              f"±{INT_LIMIT - 1}")
        return int(value)
    return float(value)


def _text(value) -> str:
    """A YAML scalar given where text is read: booleans as YAML writes them (distributed.enabled=true)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def section(cls, values: dict, name: str):
    """One section's dataclass from a mapping, each value checked against its default's type."""
    refuse_unknown_keys(cls, values, name)
    return cls(**typed_values(cls(), values, name))


def refuse_unknown_keys(cls, keys, name: str) -> None:
    """ConfigError naming the keys the section `name` (of dataclass `cls`) does not have, and those it has."""
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(keys) - set(valid))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(name + '.' + k for k in unknown)}; "
                          f"valid keys in {name}: {', '.join(valid)}")


def refuse_unknown_sections(names) -> None:
    """ConfigError naming the sections a config does not have, and those it has."""
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown section(s) {unknown}; valid sections: {', '.join(SECTIONS)}")


def typed_values(defaults, values: dict, name: str) -> dict:
    """Each of `values` checked against the type of its default in the dataclass instance `defaults`
    (keys it lacks are left for the caller to refuse)."""
    typed = {}
    for key, value in values.items():
        default = getattr(defaults, key, None)
        where = f"{name}.{key}"
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{where} must be a mapping, got {value!r}")
            value = {str(k): str(v) for k, v in value.items()}
        elif value is None and isinstance(default, (str, tuple)):  # `key:` or `key=` with nothing after it
            value = type(default)()
        elif isinstance(default, tuple):  # of text: data.corpus, finetune.labels
            value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
            if any(item is None or isinstance(item, (list, dict)) for item in value):
                raise ConfigError(f"{where} must be a list of names, got {list(value)!r}")
            value = tuple(_text(item) for item in value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where} must be true or false, got {value!r}")
        elif isinstance(default, (int, float)):
            value = _number(value, type(default), where)
        elif isinstance(default, str) and not isinstance(value, str):
            if isinstance(value, (list, dict)):
                raise ConfigError(f"{where} takes one value, got {value!r}")
            value = _text(value)
        typed[key] = value
    return typed


def from_dict(tree: dict) -> RunConfig:
    refuse_unknown_sections(tree)
    scalar = next((name for name, values in tree.items() if values is not None and not isinstance(values, dict)), None)
    if scalar:
        raise ConfigError(f"section {scalar} must be a mapping of its keys to values (key: value, one per line "
                          f"below `{scalar}:`), got {tree[scalar]!r}")
    model_values = typed_values(TransformerConfig(), dict(tree.get("model") or {}), "model")
    if "preset" in model_values and model_values["preset"] in (None, ""):
        raise ConfigError(f"model.preset is empty; name one of {', '.join(PRESETS)}, or leave the key out for "
                          "no preset")
    try:
        model = model_config(model_values.pop("preset", None), **model_values)
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from None
    sections = {name: section(cls, tree.get(name) or {}, name) for name, cls in SECTION_TYPES.items()}
    config = RunConfig(model=model, **sections)
    if config.finetune.task:
        validate_run(config)
    else:
        validate(config)
    return config


def load_tree(path: str | pathlib.Path, included_by: tuple[pathlib.Path, ...] = ()) -> dict:
    """A YAML file, following `include:` (a path relative to the including file) first."""
    path = pathlib.Path(path)
    tree = file_tree(path)
    include = tree.pop("include", None)
    if include in (None, ""):
        return tree
    if not isinstance(include, str):
        raise ConfigError(f"{path}: include: must name one config file, got {include!r}")
    target = path.parent / include
    chain = (*included_by, path)
    if target.exists() and any(target.resolve() == seen.resolve() for seen in chain):
        raise ConfigError(f"{path}: include: {include} makes a loop ({' -> '.join(map(str, (*chain, target)))}); "
                          "remove one of the includes")
    if not target.is_file():
        check_file(target, f"{path}: include:", "name a config file relative to the including one")
    return merge(load_tree(target, chain), tree)


def file_tree(path: pathlib.Path) -> dict:
    """One YAML config file's own mapping, its `include:` not followed."""
    check_file(path, "config file", "configs live in configs/ (e.g. configs/bert-tiny.yaml)")
    try:
        tree = read_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or "not YAML"
        if isinstance(err, KeyGivenTwice):
            raise ConfigError(f"{where}: {problem}") from None
        raise ConfigError(f"{where}: {problem}; a config is a YAML mapping of sections (model, data, train, ...)"
                          ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text; a config is a YAML mapping of sections") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}:1: holds a {type(tree).__name__}, not a mapping of sections "
                          "(model, data, train, ...)")
    return tree


def load(path: str | pathlib.Path, overrides: list[str] = ()) -> RunConfig:
    tree = merge(load_tree(path), parse_overrides(list(overrides)))
    if not tree:
        raise ConfigError(f"{path} sets nothing, nor do overrides; a config names at least its model (model: "
                          "{preset: bert-tiny}) and data (configs/ has one for each family)")
    return from_dict(tree)


def unread_settings(path: str | pathlib.Path, overrides: list[str], config: RunConfig) -> list[str]:
    """A note for each data setting that the config file itself (not a file it includes) or an override sets
    and that the pretraining objective of its family does not read: it changes nothing."""
    if config.finetune.task:
        return []
    given = {**(file_tree(pathlib.Path(path)).get("data") or {}), **parse_overrides(list(overrides)).get("data", {})}
    family = config.model.family
    notes = []
    for name in sorted(set(given) & set(families.OBJECTIVE_SETTINGS) - set(families.get(family).data_settings)):
        *others, last = [f.name for f in families.FAMILIES.values() if name in f.data_settings]
        readers = f"{', '.join(others)} and {last}" if others else last
        notes.append(f"data.{name} is a setting of the {readers} objectives, not of {family}'s: it changes nothing")
    return notes


def refuse_unread_sections(overrides: list[str], reads: tuple[str, ...]) -> None:
    """ConfigError for an override of an unknown section or key, or of a section outside `reads`, those the command
    reads: it would change nothing."""
    given = parse_overrides(list(overrides))
    refuse_unknown_sections(given)
    for name, values in given.items():
        if name in SECTION_TYPES and isinstance(values, dict):
            refuse_unknown_keys(SECTION_TYPES[name], values, name)
    unread = [section for section in given if section not in reads]
    if unread:
        raise ConfigError(f"the {unread[0]}.* overrides change nothing: this command reads only the "
                          f"{', '.join(reads)} settings; remove them")


def to_dict(config: RunConfig) -> dict:
    return dataclasses.asdict(config)


def check_predictions(data) -> None:
    if data.max_predictions > data.max_seq_length:
        raise ConfigError(f"data.max_predictions={data.max_predictions} exceeds data.max_seq_length="
                          f"{data.max_seq_length}; a row has no more tokens to mask")


def capped_masking(config: RunConfig) -> list[str]:
    """A note when a masked LM's slots cannot hold the share of a row that data.mask_prob masks (BERT's
    round(length × mask_prob)): the slots cap the rate, as ALBERT's recipe (20 of 512) means them to."""
    data = config.data
    wanted = round(data.mask_prob * data.max_seq_length)
    masked_lm = "max_predictions" in families.get(config.model.family).data_settings
    if config.finetune.task or not masked_lm or wanted <= data.max_predictions:
        return []
    return [f"data.max_predictions={data.max_predictions} caps the masked tokens of a {data.max_seq_length}-token "
            f"row at {data.max_predictions / data.max_seq_length:.1%}, where data.mask_prob={data.mask_prob:g} "
            f"would mask {wanted}; raise it to {wanted} for that rate (BERT: 20 at length 128, 80 at 512)"]


def validate(config: RunConfig) -> None:
    """Cross-section checks of a pretraining config that need no devices and no data."""
    data, model = config.data, config.model
    positions = model.max_position_embeddings - model.position_offset
    if data.max_seq_length > positions:
        raise ConfigError(
            f"data.max_seq_length={data.max_seq_length} exceeds the model's position table "
            f"(model.max_position_embeddings={model.max_position_embeddings}, position_offset="
            f"{model.position_offset}); lower the one or raise the other")
    if model.attention_kernel == "splash" and data.max_seq_length % 128:
        raise ConfigError(f"model.attention_kernel='splash' needs data.max_seq_length to be a multiple of 128, "
                          f"not {data.max_seq_length}; change it or use model.attention_kernel=xla")
    if model.logits_chunks and families.get(model.family).layout != "causal":
        raise ConfigError(f"model.logits_chunks={model.logits_chunks} slices a causal LM's logits (gpt2, llama); "
                          f"the {model.family} family's are small, leave it at 0")
    if model.cross_document_attention and families.get(model.family).layout != "causal":
        raise ConfigError(f"model.cross_document_attention=true is for decoders on packed rows (gpt2, llama); the "
                          f"{model.family} family's rows hold no documents to attend across, leave it false")
    if model.logits_chunks and data.max_seq_length % model.logits_chunks:
        raise ConfigError(f"model.logits_chunks={model.logits_chunks} does not divide data.max_seq_length="
                          f"{data.max_seq_length}; choose a divisor")
    try:
        check_data(data)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if "max_predictions" in families.get(model.family).data_settings:
        check_predictions(data)
    if not data.corpus:
        raise ConfigError("data.corpus is empty; name text files or demo corpora (demo:austen, demo:wikipedia, demo:news)")
    if config.bench.steps < 1:
        raise ConfigError(f"bench.steps={config.bench.steps} must be positive: the timed steps")
    for name in ("warmup", "peak_flops_per_device"):
        if getattr(config.bench, name) < 0:
            raise ConfigError(f"bench.{name}={getattr(config.bench, name):g} must be 0 or more")
    validate_run(config)


def validate_run(config: RunConfig) -> None:
    """Checks of the optimiser, mesh, train and distributed sections, which pretraining and fine-tuning share."""
    train, optim = config.train, config.optim
    if optim.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name={optim.name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if optim.grad_accum < 1:
        raise ConfigError(f"optim.grad_accum={optim.grad_accum} must be positive: the micro-batches of a step")
    for name in ("peak_lr", "end_lr", "warmup_steps", "weight_decay", "clip_norm"):
        if getattr(optim, name) < 0:
            raise ConfigError(f"optim.{name}={getattr(optim, name):g} must be 0 or more")
    if not optim.eps > 0:
        raise ConfigError(f"optim.eps={optim.eps:g} must be above 0: Adam divides by the root of the second moment "
                          "plus eps, 0 for a parameter whose gradient is 0 (unused vocabulary rows); e.g. 1e-6")
    for name in ("b1", "b2"):
        if not 0 <= getattr(optim, name) < 1:
            raise ConfigError(f"optim.{name}={getattr(optim, name):g} must lie in [0, 1): a moment's decay")
    if train.global_batch % optim.grad_accum:
        raise ConfigError(f"train.global_batch={train.global_batch} is not divisible by optim.grad_accum={optim.grad_accum}")
    if config.mesh.rules not in RULES:
        raise ConfigError(f"mesh.rules={config.mesh.rules!r}; choose one of {', '.join(RULES)}")
    sizes = [config.mesh.data, config.mesh.fsdp, config.mesh.tensor]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ConfigError(f"mesh sizes data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]}: use positive sizes, at most one -1")
    if train.nonfinite not in NONFINITE:
        raise ConfigError(f"train.nonfinite={train.nonfinite!r}; choose one of {', '.join(NONFINITE)}")
    if train.dropout_rng not in DROPOUT_RNGS:
        raise ConfigError(f"train.dropout_rng={train.dropout_rng!r}; choose one of {', '.join(DROPOUT_RNGS)}")
    if not train.run_dir.strip():
        raise ConfigError("train.run_dir is empty; name the run's directory (its checkpoints, metrics and logs)")
    if train.seed < 0:  # NumPy's generators, which shuffle a fine-tune's rows, take no negative seed
        raise ConfigError(f"train.seed={train.seed} must be 0 or more")
    if train.time_limit_minutes < 0:
        raise ConfigError(f"train.time_limit_minutes={train.time_limit_minutes:g} must be 0 (no limit) or more")
    if not train.compile_cache.strip():
        raise ConfigError("train.compile_cache is empty; give run_dir, a directory, or off")
    if train.spike_sigmas < 0 or (train.spike_sigmas > 0 and train.nonfinite != "skip"):
        raise ConfigError(f"train.spike_sigmas={train.spike_sigmas:g}: loss spikes are skipped like non-finite steps; "
                          "set train.nonfinite=skip with it, and a positive value (0 turns it off)")
    for name in ("steps", "global_batch", "log_every", "checkpoint_every", "eval_every", "max_skipped",
                 "spike_window", "keep_checkpoints"):
        if getattr(train, name) <= 0:
            raise ConfigError(f"train.{name} must be positive, got {getattr(train, name)}")
    if train.eval_batches < 0:
        raise ConfigError(f"train.eval_batches must be 0 (no held-out evaluation) or more, got {train.eval_batches}")
    check_distributed(config.distributed)


def check_distributed(dist: DistributedConfig) -> None:
    """The distributed section's values, checked whether or not this run starts the distributed runtime."""
    if dist.enabled not in DISTRIBUTED_ENABLED:
        raise ConfigError(f"distributed.enabled={dist.enabled!r}; choose auto, true or false")
    lower_bounds = (("num_processes", 0, "0: from the cluster"), ("process_id", -1, "-1: from the cluster"),
                    ("local_device_count", 0, "0: every device"))
    for name, least, meaning in lower_bounds:
        if getattr(dist, name) < least:
            raise ConfigError(f"distributed.{name}={getattr(dist, name)} must be {least} or more ({meaning})")
    for name in ("init_timeout_s", "barrier_timeout_s"):
        if not getattr(dist, name) > 0:
            raise ConfigError(f"distributed.{name}={getattr(dist, name):g} must be above 0: seconds to wait")
