"""The tasks of `jaxlm eval` on a parameter tree the caller holds: perplexity of lines and accuracy on
a BIG-bench choice task, for use inside other JAX code (no checkpoint, no output files)."""
from __future__ import annotations

import pathlib
from typing import Sequence

from jaxlm.data.tokenizers.roles import special_ids
from jaxlm.data.tokenizers.rust import RustTokenizer
from jaxlm.data.tokenizers.spm import SentencePieceTokenizer
from jaxlm.eval import tasks
from jaxlm.eval.scoring import Scorer, check_vocabulary, kind_of, place_params, position_limit
from jaxlm.models.config import TransformerConfig
from jaxlm.parallel.mesh import mesh_and_rules


def check_tokenizer(tokenizer) -> None:
    """A ValueError for a tokenizer other than jaxlm's (`load_tokenizer`), whose encode and special tokens the
    tasks read: a `tokenizers.Tokenizer` or a transformers tokenizer failed deep inside, unnamed."""
    if not isinstance(tokenizer, (RustTokenizer, SentencePieceTokenizer)):
        raise ValueError(f"tokenizer is a {type(tokenizer).__module__}.{type(tokenizer).__name__}; give jaxlm's: "
                         "jaxlm.data.tokenizers.load.load_tokenizer(path of its files)")


def _scorer(config: TransformerConfig, params, tokenizer, mesh, rules, batch_size: int):
    check_tokenizer(tokenizer)
    mesh, rules = mesh_and_rules(mesh, rules)
    scorer = Scorer(config, mesh, rules, batch_size, special_ids(tokenizer)["mask"])
    return scorer, place_params(params, config, mesh, rules)


def perplexity(config: TransformerConfig, params, tokenizer, lines: Sequence[str], *, mesh=None, rules=None,
               batch_size: int = 32, encoder_input: str = "") -> dict:
    """{"perplexity" (or "pseudo_perplexity" for encoders), "nll_per_token", "tokens", "lines"} of
    `lines` as `jaxlm eval --tasks ppl:FILE` computes them; ValueError where the lines hold no token to score."""
    if isinstance(lines, str):  # its characters were read as lines
        raise ValueError("lines is one string; give a list of lines (text.splitlines())")
    check_tokenizer(tokenizer)
    kind = kind_of(config)
    source = tokenizer.encode(encoder_input, add_special_tokens=True) if kind == "seq2seq" else ()
    windows = [tasks.line_items(tokenizer, line, kind, position_limit(config), source) for line in lines]
    items = [item for line_windows in windows for item in line_windows]
    if not any(item.continuation for item in items):
        raise ValueError(f"no tokens to score in {len(lines)} lines: pass lines with text (a decoder scores each "
                         "token after a line's first)")
    for index, line_windows in enumerate(windows):
        check_vocabulary(line_windows, config.vocab_size, f"line {index} window")
    scorer, placed = _scorer(config, params, tokenizer, mesh, rules, batch_size)
    return tasks.perplexity_metrics(kind, scorer(placed, items), len(lines))


def choice_accuracy(config: TransformerConfig, params, tokenizer, task_path, shots: int = 0, *, mesh=None,
                    rules=None, batch_size: int = 32) -> tuple[dict, list[dict]]:
    """({"accuracy", "accuracy_norm", "random_baseline"}, one record per choice) of a BIG-bench JSON
    task, `shots`-shot, as `jaxlm eval --tasks choice:FILE.json@K` computes them."""
    scorer, placed = _scorer(config, params, tokenizer, mesh, rules, batch_size)
    task = tasks.load_choice_task(pathlib.Path(task_path))
    groups = tasks.choice_items(tokenizer, scorer.kind, task, shots)
    scores = scorer(placed, [i for group in groups for i in group])
    return tasks.choice_results(task, groups, tasks.grouped(scores, groups))
