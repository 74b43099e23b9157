"""A short Sentence-BERT training on the CPU: a tiny random BERT with all-MiniLM-L6-v2's WordPiece
vocabulary, trained with the in-batch-negatives ranking loss through the trainer's own step on real
positive pairs (consecutive sentences of a news article); on held-out articles its positive pairs end
up closer than mismatched ones. `jaxlm embed` then reads the trained encoder from a converted checkpoint
and gives SentenceEncoder's vectors."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType

from jaxlm.cli import main
from jaxlm.convert.store import save_converted
from jaxlm.corpora.models import minilm_dir
from jaxlm.corpora.registry import fetch_news
from jaxlm.corpora.text import text_documents
from jaxlm.data.tokenizers.load import load_tokenizer
from jaxlm.models.config import TransformerConfig
from jaxlm.models.sentence_bert import SentenceEncoder, SiameseClassifier
from jaxlm.objectives.sentence_pairs import RankingObjective
from jaxlm.parallel.mesh import logical_sharding
from jaxlm.parallel.rules import rules_for
from jaxlm.sentence_embedding import pad_batch, truncate
from jaxlm.train.state import TrainState
from jaxlm.train.step import make_train_step

LENGTH = 32
BATCH = 32
STEPS = 200
PEAK_LR = 2e-3
HELD_OUT = 0.2  # the last fifth of the articles


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Consecutive sentences (a_i, b_i) of one article each, as id rows, and the article of each pair."""

    batch: dict
    article: np.ndarray
    texts: list[str]

    def __len__(self) -> int:
        return len(self.article)

    def rows(self, index) -> dict:
        return {k: v[index] for k, v in self.batch.items()}


def consecutive_pairs(tokenizer, articles: list[list[str]], first_article: int) -> Pairs:
    pairs = [(a, b, first_article + i) for i, article in enumerate(articles) for a, b in zip(article, article[1:])]
    side = lambda texts: pad_batch([truncate(tokenizer.encode(t, add_special_tokens=True), LENGTH) for t in texts],
                                   len(texts), LENGTH, 0)
    (ids_a, mask_a), (ids_b, mask_b) = side([p[0] for p in pairs]), side([p[1] for p in pairs])
    batch = {"input_ids_a": ids_a, "input_mask_a": mask_a.astype(np.int32), "input_ids_b": ids_b,
             "input_mask_b": mask_b.astype(np.int32), "pair_weight": np.ones(len(pairs), np.float32)}
    return Pairs(batch, np.array([p[2] for p in pairs]), [p[0] for p in pairs])


@pytest.fixture(scope="module")
def data():
    """(tokenizer, training pairs, held-out pairs) from the news corpus, split by article."""
    tokenizer = load_tokenizer(minilm_dir())
    articles = text_documents(fetch_news())
    split = int(len(articles) * (1 - HELD_OUT))
    return (tokenizer, consecutive_pairs(tokenizer, articles[:split], 0),
            consecutive_pairs(tokenizer, articles[split:], split))


@pytest.fixture(scope="module")
def objective(data):
    tokenizer, _, _ = data
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_layers=2, num_heads=2,
                               intermediate_size=128, max_position_embeddings=64, dtype="float32")
    return RankingObjective(config, LENGTH, SentenceEncoder)


@pytest.fixture(scope="module")
def trained(data, objective):
    """(initial params, trained params, training losses) after STEPS steps of the trainer's step."""
    _, train, _ = data
    params = nn.unbox(objective.init(jax.random.key(0)))
    schedule = optax.warmup_cosine_decay_schedule(0.0, PEAK_LR, 10, STEPS)
    optimizer = optax.adamw(schedule)
    state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
    step = jax.jit(make_train_step(objective, optimizer, schedule))
    rng, losses = np.random.default_rng(1), []
    for i in range(STEPS):
        state, metrics = step(state, train.rows(rng.choice(len(train), BATCH, replace=False)), jax.random.key(i))
        losses.append(float(metrics["loss"]))
    return params, jax.tree.map(np.asarray, state.params), np.array(losses)


def mean_cosines(config, params, held: Pairs) -> tuple[float, float]:
    """Mean cosine of the held-out positive pairs, and of mismatched pairs (b from another article)."""
    embed = jax.jit(lambda ids, mask: SentenceEncoder(config).apply({"params": params}, ids, None, mask))
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    u = unit(np.array(embed(held.batch["input_ids_a"], held.batch["input_mask_a"])))
    v = unit(np.array(embed(held.batch["input_ids_b"], held.batch["input_mask_b"])))
    other = np.random.default_rng(0).permutation(len(held))
    mismatched = held.article[other] != held.article
    return float((u * v).sum(-1).mean()), float((u[mismatched] * v[other][mismatched]).sum(-1).mean())


def retrieval_accuracy(objective, params, held: Pairs) -> float:
    """How often b_i scores highest for a_i among the BATCH b's of a random held-out batch (chance 1/BATCH)."""
    stats = jax.jit(lambda b: objective.stats(params, b, None, deterministic=True))
    order = np.random.default_rng(2).permutation(len(held))
    batches = [stats(held.rows(order[s:s + BATCH])) for s in range(0, len(held) - BATCH + 1, BATCH)]
    return sum(float(b["pair_correct"]) for b in batches) / sum(float(b["pair_count"]) for b in batches)


def test_ranking_training_separates_held_out_positive_pairs(data, objective, trained):
    _, train, held = data
    initial, params, losses = trained
    before = mean_cosines(objective.config, initial, held)
    after = mean_cosines(objective.config, params, held)
    accuracy = (retrieval_accuracy(objective, initial, held), retrieval_accuracy(objective, params, held))
    print(f"{len(train)} training pairs, {len(held)} held-out; loss {losses[:10].mean():.3f} -> "
          f"{losses[-20:].mean():.3f}; held-out mean cosine positive / mismatched: before {before[0]:.3f} / "
          f"{before[1]:.3f}, after {after[0]:.3f} / {after[1]:.3f}; in-batch retrieval accuracy "
          f"{accuracy[0]:.3f} -> {accuracy[1]:.3f} (chance {1 / BATCH:.3f})")
    assert losses[-20:].mean() < 0.5 * np.log(BATCH)
    assert after[0] - after[1] > 0.08
    assert after[0] - after[1] > (before[0] - before[1]) + 0.08
    assert accuracy[1] > 3 / BATCH and accuracy[1] > 2 * accuracy[0]


def test_jaxlm_embed_loads_the_trained_encoder(data, objective, trained, tmp_path):
    """The SentenceEncoder tree ({"encoder": ...}) saved as a converted checkpoint: `jaxlm embed` (mean
    pooling) returns SentenceEncoder's vectors of the same sentences."""
    _, _, held = data
    _, params, _ = trained
    assert set(params) == {"encoder"}
    save_converted(tmp_path / "sbert", objective.config, params, tokenizer_dir=minilm_dir(), source="test")
    texts = held.texts[:50]
    (tmp_path / "sentences.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    output = tmp_path / "vectors.npy"
    assert main(["embed", str(tmp_path / "sbert"), "--input", str(tmp_path / "sentences.txt"), "--output",
                 str(output), "--max-length", str(LENGTH)]) == 0
    vectors = np.load(output)
    ours = SentenceEncoder(objective.config).apply({"params": params}, held.batch["input_ids_a"][:50], None,
                                                   held.batch["input_mask_a"][:50])
    print(f"jaxlm embed vs SentenceEncoder on {len(texts)} sentences: max abs diff "
          f"{np.abs(vectors - np.asarray(ours)).max():.2e}")
    np.testing.assert_allclose(vectors, np.asarray(ours), atol=1e-5, rtol=1e-5)


def test_siamese_classifier_pairs_texts_of_different_lengths(objective, data):
    """Texts B longer than texts A: the A side is padded, so logits equal those of both padded alike;
    unequal row counts are refused."""
    _, _, held = data
    rows = held.rows(np.arange(4))
    a, mask_a = rows["input_ids_a"][:, :12], rows["input_mask_a"][:, :12]
    b, mask_b = rows["input_ids_b"][:, :20], rows["input_mask_b"][:, :20]
    model = SiameseClassifier(objective.config, 3)
    params = model.init(jax.random.key(0), a, mask_a, b, mask_b)
    widen = lambda x: np.pad(x, ((0, 0), (0, 8)))
    np.testing.assert_allclose(model.apply(params, a, mask_a, b, mask_b),
                               model.apply(params, widen(a), widen(mask_a), b, mask_b), atol=1e-6)
    with pytest.raises(ValueError, match="4 A rows and 3 B rows"):
        model.apply(params, a, mask_a, b[:3], mask_b[:3])


@pytest.mark.parametrize("axis_types", [AxisType.Auto, AxisType.Explicit])
def test_ranking_loss_over_the_global_batch_on_an_fsdp_mesh(objective, data, axis_types):
    """Rows split over 8 devices (fsdp rules, auto or explicit mesh axes), three of them padding: the
    loss and gradient equal those of the batch on one device."""
    _, _, held = data
    batch = held.rows(np.arange(16)) | {"pair_weight": np.r_[np.ones(13), np.zeros(3)].astype(np.float32)}
    params = nn.unbox(objective.init(jax.random.key(0)))
    loss_fn = lambda p, b: objective.summarize(objective.stats(p, b, None, deterministic=True))["loss"]
    expected_loss, expected_grads = jax.jit(jax.value_and_grad(loss_fn))(params, batch)
    mesh = jax.make_mesh((1, 8, 1), ("data", "fsdp", "tensor"), axis_types=(axis_types,) * 3)
    rules = rules_for("fsdp")
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        placed = {k: jax.device_put(v, logical_sharding(mesh, rules, objective.batch_axes[k]))
                  for k, v in batch.items()}
        loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params, placed)
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, expected_grads)
