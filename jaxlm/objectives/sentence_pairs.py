"""Sentence-BERT training as objectives (batch format, loss, metrics) over pairs of texts A and B, with
sentence-transformers' losses: SoftmaxLoss (a class per pair, NLI style) on SiameseClassifier;
CosineSimilarityLoss (a score per pair) and MultipleNegativesRankingLoss (positive pairs, the other B
texts of the global batch as negatives) on SentenceEncoder (jaxlm.models.sentence_bert).

A pair counts where its `pair_weight` is 1; padding rows carry 0. Texts are single segments (segment 0).
The ranking loss wants the whole batch in one step: with gradient accumulation its negatives are only
those of each micro-batch."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlm.models.sentence_bert import stack_pairs
from jaxlm.objectives.base import FLOAT, INT, Field, Objective
from jaxlm.objectives.finetune import accuracy_summary, encoder_flops_per_token
from jaxlm.objectives.losses import prediction_stats, ratio
from jaxlm.parallel.logical import constrain

# torch.nn.functional.cosine_similarity's floor on the norms' product
COSINE_EPS = 1e-8
# sentence-transformers' MultipleNegativesRankingLoss default: cosine similarities times 20
RANKING_SCALE = 20.0
# the score of a padding column: exp() of it is exactly 0 in float32, and no inf reaches the gradient
EXCLUDED = -1e9


def pair_fields(seq: int) -> dict[str, Field]:
    texts = {f"{name}_{side}": Field((seq,), INT, ("length",))
             for side in ("a", "b") for name in ("input_ids", "input_mask")}
    return texts | {"pair_weight": Field((), FLOAT, ())}


def cosine(u: jax.Array, v: jax.Array) -> jax.Array:
    """Row-wise cosine similarity [B] as torch.nn.functional.cosine_similarity computes it."""
    norms = jnp.sqrt(jnp.maximum(jnp.sum(u * u, -1) * jnp.sum(v * v, -1), COSINE_EPS ** 2))
    return jnp.sum(u * v, -1) / norms


def unit(x: jax.Array) -> jax.Array:
    """Rows scaled to length 1, as torch.nn.functional.normalize (eps 1e-12)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@dataclasses.dataclass(frozen=True)
class SentencePairObjective(Objective):
    """What the three share: the pair fields, and both texts through the encoder in one pass."""

    def fields(self):
        return pair_fields(self.max_seq_length)

    def model_inputs(self, batch: dict):
        ids, mask = stack_pairs(self.config, batch["input_ids_a"], batch["input_mask_a"], batch["input_ids_b"],
                                batch["input_mask_b"])
        return ids, None, mask

    def embeddings(self, params, batch, rng, deterministic: bool) -> tuple[jax.Array, jax.Array]:
        """(u, v): the sentence vectors of texts A and B, float32 [B, E] each."""
        u, v = jnp.split(self.apply(params, batch, rng, deterministic), 2)
        return u, v

    def flops_per_token(self) -> float:
        return encoder_flops_per_token(self.config, self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class SoftmaxPairObjective(SentencePairObjective):
    """`label` (a class) per pair; cross-entropy of SiameseClassifier's logits on (u, v, |u - v|)."""

    def fields(self):
        return super().fields() | {"label": Field((), INT, ())}

    def model_inputs(self, batch: dict):
        return batch["input_ids_a"], batch["input_mask_a"], batch["input_ids_b"], batch["input_mask_b"]

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        logits = self.apply(params, batch, rng, deterministic)
        return prediction_stats("label", logits, batch["label"], batch["pair_weight"])

    def summarize(self, stats: dict) -> dict:
        return accuracy_summary(stats)


@dataclasses.dataclass(frozen=True)
class CosineSimilarityObjective(SentencePairObjective):
    """`score` per pair; loss = mean squared error between cos(u, v) and the score. Cosines lie in
    [-1, 1]: scores in [0, 1] (sentence-transformers' convention, e.g. STS-B's 0-5 divided by 5) or
    in [-1, 1] both work."""

    def fields(self):
        return super().fields() | {"score": Field((), FLOAT, ())}

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        u, v = self.embeddings(params, batch, rng, deterministic)
        weights = batch["pair_weight"].astype(jnp.float32)
        error = (cosine(u, v) - batch["score"]) ** 2
        return {"score_squared_error": jnp.sum(error * weights), "score_count": jnp.sum(weights)}

    def summarize(self, stats: dict) -> dict:
        mse = ratio(stats["score_squared_error"], stats["score_count"])
        return {"loss": mse, "mse": mse}


@dataclasses.dataclass(frozen=True)
class RankingObjective(SentencePairObjective):
    """Positive pairs (a_i, b_i); text a_i's scores are `scale` * cos(a_i, b_j) over every b_j of the
    global batch, cross-entropy with target i (MultipleNegativesRankingLoss). A pair whose `pair_weight`
    is 0 is neither an anchor nor a negative; `accuracy`: how often b_i scores highest."""

    scale: float = RANKING_SCALE

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        u, v = self.embeddings(params, batch, rng, deterministic)
        weights = batch["pair_weight"]
        # every device scores its anchors against the whole batch's candidates
        candidates, candidate_weights = constrain(unit(v), (None, "embed")), constrain(weights, (None,))
        scores = self.scale * unit(u) @ candidates.T
        scores = jnp.where(candidate_weights[None, :] > 0, scores, EXCLUDED)
        return prediction_stats("pair", scores, jnp.arange(scores.shape[0]), weights)

    def summarize(self, stats: dict) -> dict:
        return accuracy_summary(stats, "pair")
