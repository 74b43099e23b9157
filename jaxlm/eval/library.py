"""The tasks of `jaxlm eval` on a parameter tree the caller holds: perplexity of lines and accuracy on
a BIG-bench choice task, for use inside other JAX code (no checkpoint, no output files)."""
from __future__ import annotations

import pathlib
from typing import Sequence

from jaxlm.config import MeshConfig
from jaxlm.data.tokenizers.roles import special_ids
from jaxlm.eval import tasks
from jaxlm.eval.scoring import Scorer, place_params, position_limit
from jaxlm.models.config import TransformerConfig
from jaxlm.parallel.mesh import auto_axes, make_mesh
from jaxlm.parallel.rules import rules_for


def _scorer(config: TransformerConfig, params, tokenizer, mesh, rules, batch_size: int):
    if mesh is None:
        mesh, rules = make_mesh(MeshConfig()), rules_for(MeshConfig().rules)
    mesh = auto_axes(mesh)
    scorer = Scorer(config, mesh, tuple(rules), batch_size, special_ids(tokenizer)["mask"])
    return scorer, place_params(params, config, mesh, tuple(rules))


def perplexity(config: TransformerConfig, params, tokenizer, lines: Sequence[str], *, mesh=None, rules=(),
               batch_size: int = 32, encoder_input: str = "") -> dict:
    """{"perplexity" (or "pseudo_perplexity" for encoders), "nll_per_token", "tokens", "lines"} of
    `lines` as `jaxlm eval --tasks ppl:FILE` computes them."""
    scorer, placed = _scorer(config, params, tokenizer, mesh, rules, batch_size)
    source = tokenizer.encode(encoder_input, add_special_tokens=True) if scorer.kind == "seq2seq" else ()
    items = [i for line in lines
             for i in tasks.line_items(tokenizer, line, scorer.kind, position_limit(config), source)]
    return tasks.perplexity_metrics(scorer.kind, scorer(placed, items), len(lines))


def choice_accuracy(config: TransformerConfig, params, tokenizer, task_path, shots: int = 0, *, mesh=None,
                    rules=(), batch_size: int = 32) -> tuple[dict, list[dict]]:
    """({"accuracy", "accuracy_norm", "random_baseline"}, one record per choice) of a BIG-bench JSON
    task, `shots`-shot, as `jaxlm eval --tasks choice:FILE.json@K` computes them."""
    scorer, placed = _scorer(config, params, tokenizer, mesh, rules, batch_size)
    task = tasks.load_choice_task(pathlib.Path(task_path))
    groups = tasks.choice_items(tokenizer, scorer.kind, task, shots)
    scores = scorer(placed, [i for group in groups for i in group])
    return tasks.choice_results(task, groups, tasks.grouped(scores, groups))
