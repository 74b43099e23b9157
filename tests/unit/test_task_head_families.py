"""The fine-tuning heads built directly, as a library user does: each sits on the backbone its config's family
registers (the one `jaxlm finetune` gives it) and pools as the family's Hugging Face head, refuses a family it
cannot serve, and refuses fewer than one label."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from jaxlm.models import (AlbertEncoder, CausalLM, CrfTagger, DecoderClassifier, MultipleChoice, QuestionAnswering,
                          SentenceEncoder, SequenceClassifier, SiameseClassifier, SpanLabeller, TokenClassifier,
                          model_config)

SIZES = dict(vocab_size=100, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1,
             max_position_embeddings=32, dtype="float32")
IDS = jnp.ones((2, 8), jnp.int32)


def tiny(preset: str, **extra):
    return model_config(preset, **SIZES, **extra)


def names(module, *args) -> set[str]:
    params = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), *args))["params"])
    return {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_an_albert_classifier_sits_on_albert_and_a_roberta_one_pools_as_roberta():
    """An ALBERT config once went into a BERT encoder: no projection of the factorised embeddings, so a
    broadcasting error inside Flax."""
    albert = tiny("albert-base", embedding_size=16)
    built = names(SequenceClassifier(albert, 2), IDS)
    assert built == names(SequenceClassifier(albert, 2, "pooler", AlbertEncoder), IDS)
    assert {"['encoder']['projection']['kernel']", "['encoder']['layer']['attention']['query']['kernel']"} <= built
    roberta = names(SequenceClassifier(tiny("roberta-base"), 2), IDS)
    assert "['dense']['kernel']" in roberta and not any(name.startswith("['encoder']['pooler']") for name in roberta)


def test_a_gpt2_classifier_is_the_decoder_classifier_on_gpt2s_decoder():
    """A GPT-2 config once got a BERT encoder without a word; SequenceClassifier now refuses it, naming what
    serves it."""
    gpt2 = tiny("gpt2-small")
    with pytest.raises(ValueError) as refused:
        SequenceClassifier(gpt2, 2)
    assert str(refused.value) == ("SequenceClassifier sits on an encoder, which a gpt2 model has not; families with "
                                  "one: bert, roberta, distilbert, albert, spanbert; a decoder's is DecoderClassifier")
    classifier = names(DecoderClassifier(gpt2, 2), IDS)
    decoder = {name for name in names(CausalLM(gpt2), IDS) if name.startswith("['decoder']")}
    assert decoder and decoder <= classifier and classifier - decoder == {"['score']"}
    with pytest.raises(ValueError, match=r"^DecoderClassifier sits on a decoder, which a bert model is not; decoder "
                                         r"families: gpt2, llama$"):
        DecoderClassifier(tiny("bert-tiny"), 2)


@pytest.mark.parametrize("head", [lambda c: TokenClassifier(c, 3), lambda c: QuestionAnswering(c),
                                  lambda c: MultipleChoice(c), lambda c: CrfTagger(c, 3), lambda c: SpanLabeller(c, 3),
                                  lambda c: SentenceEncoder(c), lambda c: SiameseClassifier(c, 3)])
def test_every_encoder_head_refuses_an_encoder_decoder(head):
    with pytest.raises(ValueError, match=r"sits on an encoder, which a t5 model has not; families with one: bert,"):
        head(tiny("t5-small", head_size=16))


@pytest.mark.parametrize("labels", [0, -1])
@pytest.mark.parametrize("head", [SequenceClassifier, TokenClassifier, CrfTagger, SpanLabeller, SiameseClassifier,
                                  DecoderClassifier])
def test_fewer_than_one_label_is_refused(head, labels):
    config = tiny("gpt2-small" if head is DecoderClassifier else "bert-tiny")
    with pytest.raises(ValueError) as refused:
        head(config, labels)
    assert str(refused.value) == f"{head.__name__}: num_labels={labels}; use 1 (regression) or more classes"


def test_positions_left_out_give_every_positions_outputs_and_choices_need_their_axis():
    """BERT's and ALBERT's pretraining models without masked_positions, and CrfTagger without word_positions, were
    AttributeErrors on None (MaskedLM already gave every position's logits); MultipleChoice given [B, T] ids was
    "not enough values to unpack"."""
    from jaxlm.models import AlbertForPreTraining, BertForPreTraining
    every = jnp.broadcast_to(jnp.arange(8), IDS.shape)
    for module in (BertForPreTraining(tiny("bert-tiny")), AlbertForPreTraining(tiny("albert-base", embedding_size=16)),
                   CrfTagger(tiny("bert-tiny"), 3)):
        variables = module.init(jax.random.key(0), IDS, None, None, every)
        whole, at_every = module.apply(variables, IDS), module.apply(variables, IDS, None, None, every)
        assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), whole, at_every))
    with pytest.raises(ValueError, match=r"^MultipleChoice reads input_ids \[batch, choices, length\], not shape "
                                         r"\(2, 8\)"):
        MultipleChoice(tiny("bert-tiny")).init(jax.random.key(0), IDS)
