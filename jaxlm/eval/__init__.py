"""Evaluating checkpoints: `jaxlm eval` sweeps (jaxlm.eval.sweep) and, for use inside other JAX code,
log-likelihoods of continuations on a parameter tree the caller holds."""
from jaxlm.eval.scoring import Item, Scorer, loglikelihoods
from jaxlm.eval.tasks import choice_items, line_items, load_choice_task, perplexity_metrics

__all__ = ["Item", "Scorer", "loglikelihoods", "choice_items", "line_items", "load_choice_task", "perplexity_metrics"]
