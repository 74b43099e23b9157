"""Evaluating checkpoints: `jaxlm eval` sweeps (jaxlm.eval.sweep) and, for use inside other JAX code,
the same tasks and log-likelihoods on a parameter tree the caller holds."""
from jaxlm.eval.library import choice_accuracy, perplexity
from jaxlm.eval.scoring import Item, Scorer, loglikelihoods
from jaxlm.eval.tasks import choice_items, line_items, load_choice_task, perplexity_metrics

__all__ = ["Item", "Scorer", "loglikelihoods", "perplexity", "choice_accuracy", "choice_items", "line_items",
           "load_choice_task", "perplexity_metrics"]
