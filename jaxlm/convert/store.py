"""Converted checkpoints on disk, reading them or run checkpoints back, Hugging Face directories, tokenizers."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import re
import shutil
import tempfile
from typing import Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
import safetensors.numpy

from jaxlm import config as config_lib
from jaxlm import families, interrupts
from jaxlm.convert import registry
from jaxlm.corpora.text import check_writable, file_in_the_way, utf8_text
from jaxlm.data.sources import resolve_vocab
from jaxlm.data.tokenizers.load import NAME_IN_A_DIRECTORY, load_tokenizer
from jaxlm.data.tokenizers.roles import special_ids
from jaxlm.data.layouts import PAIRED, frame_ids, framed
from jaxlm.data.tokenizers.spm_json import frame, to_tokenizers
from jaxlm.errors import first_line
from jaxlm.models.config import TransformerConfig
from jaxlm.models.presets import model_config
from jaxlm.train import checkpoint

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                   "spiece.model", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe")
BINARY_TOKENIZER_FILES = ("spiece.model",)  # the rest of TOKENIZER_FILES are UTF-8 text
READ_TOKENIZER_FILES = set(TOKENIZER_FILES) - {"tokenizer_config.json", "special_tokens_map.json"}  # the vocabularies
TOKENIZER_DIR = "tokenizer"
ROBERTA_TOKENS = {"<s>", "</s>", "<pad>", "<unk>", "<mask>"}
MAX_REASON = 160  # characters of a library's reason for a damaged checkpoint
NOT_A_CHECKPOINT = ("expected a directory written by `jaxlm convert from-hf`, a training run directory "
                    "(train.run_dir) or one of its checkpoints/<step> directories")


@dataclasses.dataclass(frozen=True)
class CheckpointTokenizer:
    """Where a checkpoint's tokenizer lies and how its text became ids: a converted checkpoint's tokenizer/
    directory, or a run's data.vocab with the run's data.lowercase and data.sentinels."""

    location: pathlib.Path
    lowercase: bool = True
    sentinels: int = 0
    layout: str = ""  # the model family's rows, which a bare SentencePiece model frames texts as ("": no frame)
    model_vocab: int = 0  # the model's vocabulary (0: unchecked), which a run's tokenizer equals and no other exceeds
    exact: bool = False

    def load(self):
        tokenizer = load_tokenizer(self.location, lowercase=self.lowercase, sentinels=self.sentinels)
        size = tokenizer.vocab_size
        if self.model_vocab and (size != self.model_vocab if self.exact else size > self.model_vocab):
            raise ValueError(f"the tokenizer at {self.location} has {size} tokens but the checkpoint's model "
                             f"{self.model_vocab}: tokenizer and checkpoint do not match (a run's data.vocab is read "
                             "where the command runs, a relative one from the directory it ran in)")
        return framed(tokenizer, self.layout) if self.layout else tokenizer


# ---------------------------------------------------------------- writing without losing anything

def check_output(out, overwrite: bool, source=None, kept_out_of=None) -> pathlib.Path:
    """`out` as a path, after refusing a file, a run's directory, a non-empty directory unless `overwrite`, the
    `source` being converted or a directory holding it, and any place inside `kept_out_of` (the checkpoints of a
    run)."""
    out = pathlib.Path(out)
    target = out.resolve()
    source_path = None if source is None else pathlib.Path(source).resolve()
    if source_path is not None and target in (source_path, *source_path.parents):
        raise ValueError(f"output {out} would replace the input {source}; choose another output directory")
    if kept_out_of is not None and pathlib.Path(kept_out_of).resolve() in (target, *target.parents):
        raise ValueError(f"output {out} lies in {kept_out_of}, where Orbax keeps the checkpoints; choose an "
                         "output directory outside it")
    if (blocked := file_in_the_way(out)) is not None:  # before the conversion, not when its output is moved there
        raise FileExistsError(f"{blocked} is a file where a directory is needed for the output {out}; choose "
                              "another output directory")
    if checkpoint.is_run_dir(out):  # --overwrite once deleted a whole training run
        raise FileExistsError(f"{out} is a run's directory (it holds checkpoints/), which no output replaces, with "
                              "--overwrite or without; choose another output directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; pass --overwrite to replace it, "
                              "or choose another output directory")
    check_writable(out.absolute().parent, f"output {out}")  # the output is staged beside it
    return out


@contextlib.contextmanager
def staged(out, overwrite: bool = False):
    """Yields a fresh sibling directory of `out`; it becomes `out` only when the block succeeds uninterrupted
    (Ctrl-C while the earlier `out` is swapped for it waits until the swap is done)."""
    out = check_output(out, overwrite).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        with interrupts.held(raising=True) as received:
            yield staging
            interrupts.raise_for(received)  # raised inside JAX's garbage-collection hook, and ignored there
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, Exception) and "No space left on device" in str(err):  # Orbax's, safetensors' own words
            raise OSError(f"no space left on the device to write {out}; free space or choose another output "
                          "directory") from None
        raise
    staging.chmod(0o755)
    old = None
    with interrupts.held():
        try:  # again: something else may have written `out` meanwhile, which only --overwrite replaces
            check_output(out, overwrite)
        except FileExistsError as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise FileExistsError(f"{err} (it was written while this command ran)") from None
        if overwrite and out.exists():  # without it, `out` is at most an empty directory, which the swap replaces
            old = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old / out.name)
        try:
            os.replace(staging, out)
        except OSError:  # another command's output took `out` between the check and here (ENOTEMPTY)
            shutil.rmtree(staging, ignore_errors=True)
            raise FileExistsError(f"{out} was written by another command while this one ran; run it again, with "
                                  "--overwrite to replace that output, or choose another output directory") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def tokenizer_sources(source) -> list[tuple[pathlib.Path, str]]:
    """(file, its name in a tokenizer directory) of whichever TOKENIZER_FILES `source` (a directory, or one
    tokenizer file) has; a text file among them that is not UTF-8 is a ValueError naming it and its line."""
    if source is None:
        return []
    source = pathlib.Path(source)
    if source.is_file():
        named = [(source, NAME_IN_A_DIRECTORY.get(source.suffix, source.name))]
    else:
        named = [(source / name, name) for name in TOKENIZER_FILES if (source / name).is_file()]
    for path, name in named:
        if name not in BINARY_TOKENIZER_FILES:
            utf8_text(path)
    return named


def no_tokenizer(path, so: str) -> ValueError:
    """What a command that reads text says of a converted checkpoint without a tokenizer, `so` what that stops."""
    return ValueError(f"{path} has no {TOKENIZER_DIR}/ directory, so {so}: convert the model again from a directory "
                      "that also holds its tokenizer files (tokenizer.json, vocab.txt, spiece.model, or vocab.json + "
                      "merges.txt)")


def check_tokenizer_files(source) -> None:
    """A ValueError naming the tokenizer file of `source` that is not text, or that its loader cannot read (a
    directory of weights alone has none to check)."""
    if {name for _, name in tokenizer_sources(source)} & READ_TOKENIZER_FILES:
        load_tokenizer(source)


def copy_tokenizer(source, target, lowercase: bool = True) -> list[str]:
    """Copies whichever TOKENIZER_FILES `source` (a directory, or one tokenizer file) has into `target`, and returns
    their names there (see `tokenizer_sources`). One file takes the name a directory of its kind is read by
    (`my-vocab.txt` becomes vocab.txt), whatever its own; a vocab.txt without a tokenizer_config.json also gets
    one saying `lowercase`, which loaders (ours, transformers') otherwise take to be true."""
    named = tokenizer_sources(source)
    if not named:
        return []
    target = pathlib.Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for path, name in named:
        shutil.copyfile(path, target / name)
    copied = [name for _, name in named]
    if "vocab.txt" in copied and "tokenizer_config.json" not in copied:
        (target / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase}) + "\n")
    return copied


def write_hf_tokenizer(tokenizer: CheckpointTokenizer, target, layout: str = "causal") -> None:
    """The checkpoint's tokenizer files in `target` as transformers' AutoTokenizer reads them with the ids the run
    used, whatever the model's family. A Hugging Face tokenizer directory (one with a tokenizer_config.json) is
    copied as it is: it says how it is read. Otherwise tokenizer_config.json names the class that reads the file
    our loader reads (see `hf_tokenizer_class`) and the special tokens as the run's pipelines used them; a
    SentencePiece model also becomes a tokenizer.json (sentinels included) that, with `add_special_tokens=True`,
    frames a text as the family's `layout` framed its rows; GPT-2's encoder.json and vocab.bpe are also written as
    vocab.json and merges.txt."""
    target = pathlib.Path(target)
    copied = copy_tokenizer(tokenizer.location, target, tokenizer.lowercase)
    if not copied or "tokenizer_config.json" in copied:
        return
    loaded = tokenizer.load()
    roles = special_ids(loaded)
    from_spiece = "spiece.model" in copied and not {"tokenizer.json", "vocab.txt"} & set(copied)
    if from_spiece:
        converted = to_tokenizers(target / "spiece.model", tokenizer.sentinels)
        frame(converted, *frame_ids(roles, layout))
        converted.save(str(target / "tokenizer.json"))
        copied.append("tokenizer.json")
    for ours, theirs in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        if ours in copied and theirs not in copied:
            shutil.copyfile(target / ours, target / theirs)
    named = {f"{role}_token": loaded.convert_ids_to_tokens([i])[0]
             for role, i in roles.items() if role != "sentinels" and i is not None}
    settings = {"tokenizer_class": hf_tokenizer_class(copied, set(named.values())), **named}
    if settings["tokenizer_class"] == "BertTokenizer":
        settings["do_lower_case"] = tokenizer.lowercase
    if from_spiece and layout in PAIRED:  # the generic class returns token_type_ids only when told to
        settings["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    if roles["sentinels"]:
        settings["additional_special_tokens"] = loaded.convert_ids_to_tokens(roles["sentinels"])
    (target / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def hf_tokenizer_class(files: list[str], special_tokens: set[str]) -> str:
    """The transformers class that reads, as our loader does, the first of `files` our loader reads: a tokenizer.json
    through the generic fast class (a family's own would add its assumptions: T5's, 100 sentinels and <unk> at 2;
    Llama's, a file named tokenizer.model; ALBERT's, lowercasing), a vocab.txt as BERT's WordPiece, and byte-level
    BPE files as RoBERTa's where the vocabulary has its special tokens (so that its <s> ... </s> template applies),
    else as GPT-2's (which adds no token of its own)."""
    if "tokenizer.json" in files:
        return "PreTrainedTokenizerFast"
    if "vocab.txt" in files:
        return "BertTokenizer"
    return "RobertaTokenizer" if ROBERTA_TOKENS <= special_tokens else "GPT2Tokenizer"


# ---------------------------------------------------------------- converted checkpoints

def save_converted(out_dir, config: TransformerConfig, params: Mapping, tokenizer_dir=None, source: str = "",
                   overwrite: bool = False, tokenizer_files: Mapping[str, str] | None = None) -> pathlib.Path:
    """Writes a converted checkpoint: the items of a run checkpoint at step 0, so `train.init_from` reads it.

        OUT/0/state      {"params": parameter tree}   (Orbax PyTree)
        OUT/0/data       {"step": 0}
        OUT/0/config     {"model": TransformerConfig as a dict, "source": where it came from}
        OUT/tokenizer/   whichever TOKENIZER_FILES `tokenizer_dir` has, and `tokenizer_files` (name -> text)
    """
    tokenizer_sources(tokenizer_dir)  # a tokenizer file that is not text is refused before anything is written
    with staged(out_dir, overwrite) as staging:
        mngr = checkpoint.manager(staging, keep=1, async_save=False)
        record = {"model": dataclasses.asdict(config), "source": str(source)}
        with interrupts.held() as received:  # cut short, Orbax's threads write on into staging
            checkpoint.save(mngr, 0, {"params": dict(params)}, {"step": 0}, record)
            mngr.wait_until_finished()
            mngr.close()
        interrupts.raise_for(received)
        copy_tokenizer(tokenizer_dir, staging / TOKENIZER_DIR)
        for name, text in (tokenizer_files or {}).items():
            (staging / TOKENIZER_DIR).mkdir(exist_ok=True)
            (staging / TOKENIZER_DIR / name).write_text(text, encoding="utf-8")
    return pathlib.Path(out_dir)


def _not_a_checkpoint(path: pathlib.Path, why: str) -> ValueError:
    hint = (" (it looks like a Hugging Face model: convert it first with `jaxlm convert from-hf`)"
            if (path / "config.json").is_file() and not checkpoint.is_run_dir(path) else "")
    return ValueError(f"{path} is not a jaxlm checkpoint: {why}{hint}; {NOT_A_CHECKPOINT}")


@contextlib.contextmanager
def _opened(path: pathlib.Path):
    """(read-only manager, step) of a checkpoint path, after checking it is a jaxlm checkpoint."""
    with checkpoint.open_checkpoint(path) as (mngr, step):
        if step is None:
            raise _not_a_checkpoint(path, "it holds no Orbax checkpoint step")
        if not all((mngr.directory / str(step) / item).is_dir() for item in ("config", "state")):
            raise _not_a_checkpoint(path, f"step {step} has no config or state item")
        yield mngr, step


@contextlib.contextmanager
def _damaged(path: pathlib.Path, mngr, step: int, part: str):
    """Whatever Orbax or TensorStore raise while the block reads `part` of a step becomes one line: the checkpoint
    and step, the reason (the array it names and the last clause of its message), and what to do instead."""
    try:
        yield
    except (PermissionError, MemoryError):  # not damage: said as they are
        raise
    except Exception as err:  # Orbax, TensorStore and json raise many kinds for a truncated or emptied file
        others = [str(s) for s in mngr.all_steps() if s != step]
        instead = (f"pass another of its steps (checkpoints/<step>: {', '.join(others)})" if others
                   else "convert or save it again")
        raise ValueError(f"{path} step {step} could not be read: {part}: {_reason(err)}; the checkpoint is damaged: "
                         f"{instead}") from None


def _reason(err: Exception) -> str:
    """TensorStore's message cut to the array it names and its last clause (it names every layer it went through
    and appends its whole spec); others' first line."""
    text = first_line(err).split(" [tensorstore_spec=", 1)[0]
    if len(text) <= MAX_REASON:
        return text
    array = re.search(r'Error reading "([^"/]+)', text)
    return (f"array {array.group(1)}: " if array else "") + text.rsplit(": ", 1)[-1][:MAX_REASON]


def _config(mngr, step: int, path: pathlib.Path) -> tuple[TransformerConfig, CheckpointTokenizer | None]:
    with _damaged(path, mngr, step, "its config item"):
        stored = checkpoint.stored_config(mngr, step)
    if stored is None:
        raise _not_a_checkpoint(path, "its config item has no model")
    return _stored_config(stored, pathlib.Path(mngr.directory))  # a converted checkpoint's tokenizer/: by its steps


def finetuned_for(path) -> str:
    """The finetune.task a run's checkpoint was fine-tuned for; empty for pretraining runs and conversions."""
    path = pathlib.Path(path)
    with _opened(path) as (mngr, step), _damaged(path, mngr, step, "its config item"):
        return checkpoint.finetuned_task(mngr, step)


def checkpoint_config(path) -> tuple[TransformerConfig, CheckpointTokenizer | None]:
    """(model config, tokenizer or None) of a checkpoint, without reading its parameters."""
    with _opened(pathlib.Path(path)) as (mngr, step):
        return _config(mngr, step, pathlib.Path(path))


def load_checkpoint(path) -> tuple[TransformerConfig, dict, CheckpointTokenizer | None]:
    """(model config, parameter tree of numpy arrays, tokenizer or None) of a converted checkpoint or a
    training run (its latest step)."""
    path = pathlib.Path(path)
    with _opened(path) as (mngr, step):
        config, tokenizer = _config(mngr, step, path)
        with _damaged(path, mngr, step, "its state metadata"):
            tree = checkpoint.stored_tree(mngr, step)
        if "params" not in tree:
            raise ValueError(f"{mngr.directory / str(step) / 'state'} holds no params")
        with _damaged(path, mngr, step, "its parameters"):
            params = _restore_params(mngr, step, tree)
    registry.check_shapes(config, params, str(path))
    return config, params, tokenizer


def _stored_config(stored: dict, directory: pathlib.Path) -> tuple[TransformerConfig, CheckpointTokenizer | None]:
    if "train" in stored:
        run = config_lib.from_dict(stored)
        return run.model, CheckpointTokenizer(resolve_vocab(run.data), run.data.lowercase, run.data.sentinels,
                                              families.get(run.model.family).layout, run.model.vocab_size, exact=True)
    config = model_config(**config_lib.typed_values(TransformerConfig(), stored["model"], "model"))
    tokenizer = directory / TOKENIZER_DIR
    if not tokenizer.is_dir():
        return config, None
    return config, CheckpointTokenizer(tokenizer, layout=families.get(config.family).layout,
                                       model_vocab=config.vocab_size)


def _restore_params(mngr, step: int, tree) -> dict:
    """The `params` subtree of the state item as numpy arrays, shapes and dtypes from its metadata `tree`."""
    target = {"params": tree["params"]}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=target, restore_args=restore_args, partial_restore=True)))
    return restored["state"]["params"]


# ---------------------------------------------------------------- Hugging Face directories

def save_hf(out_dir, config: TransformerConfig, params: Mapping, tokenizer: CheckpointTokenizer | None = None,
            overwrite: bool = False) -> str:
    """Writes config.json, model.safetensors (float32) and the tokenizer files at `out_dir`; returns
    the transformers auto class that loads it."""
    hf_config, tensors, auto_class = registry.to_hf(config, params)
    if tokenizer:
        tokenizer_sources(tokenizer.location)  # as save_converted: refused before anything is written
    with staged(out_dir, overwrite) as staging:
        if tokenizer:
            write_hf_tokenizer(tokenizer, staging, registry.family_of(config).layout)
        (staging / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        safetensors.numpy.save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
                                    str(staging / "model.safetensors"), metadata={"format": "pt"})
    return auto_class
