"""The family registry is complete and the only place that tells families apart."""
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from jaxlm import families
from jaxlm.data.layouts import LAYOUTS
from jaxlm.data.settings import DataConfig
from jaxlm.models.presets import PRESETS, model_config
from jaxlm.models.task_heads import SequenceClassifier

PACKAGE = pathlib.Path(families.__file__).parent
FAMILY_NAMES = "|".join(families.FAMILIES)
# a family name written as a string literal next to a comparison or membership test
COMPARISON = re.compile(rf"""(==|!=|\bin\b)\s*\(?[^#\n]*["']({FAMILY_NAMES})["']|["']({FAMILY_NAMES})["']\s*(==|!=)""")


def test_every_preset_names_a_registered_family():
    assert {config.family for config in PRESETS.values()} == set(families.FAMILIES)


@pytest.mark.parametrize("name", sorted(families.FAMILIES))
def test_each_family_is_complete(name):
    family = families.get(name)
    assert family.layout in LAYOUTS
    preset = next(p for p, c in PRESETS.items() if c.family == name)
    config = model_config(preset, vocab_size=256, hidden_size=32, num_heads=2, intermediate_size=64,
                          num_layers=1, num_kv_heads=0, **({"embedding_size": 16} if name == "albert" else {}))
    objective = family.make_objective(config, DataConfig(max_seq_length=16, max_predictions=3))
    params = jax.eval_shape(objective.init, jax.random.key(0))
    assert jax.tree.leaves(params)
    if family.converters:
        for suffix in ("config_from_hf", "config_to_hf", "params_from_hf", "params_to_hf"):
            assert callable(family.converter(suffix))
    assert family.generates in ("", "causal", "seq2seq")


def test_abilities_select_the_expected_families():
    assert families.names(embeds=True) == ["bert", "roberta", "distilbert", "albert", "spanbert"]
    assert families.names(generates="causal") == ["gpt2", "llama"]
    assert families.names(generates="seq2seq") == ["t5", "bart"]
    with pytest.raises(ValueError, match=r"model.family='gpt3'; choose one of bert, roberta"):
        families.get("gpt3")


def test_no_module_but_the_registry_compares_family_names():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "families.py" or path.parent.name == "convert":  # converters check HF model_type
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("name", families.names(embeds=True))
def test_a_pretrained_encoder_loads_into_the_family_fine_tuning_heads(name):
    """Every parameter of the pretraining network's encoder is in the sequence head's, with its shape."""
    family = families.get(name)
    preset = min((p for p, c in PRESETS.items() if c.family == name), key=lambda p: PRESETS[p].hidden_size)
    config = model_config(preset, max_position_embeddings=32, num_layers=2, dtype="float32")
    pretrained = jax.eval_shape(families.make_objective(config, DataConfig(max_seq_length=16, max_predictions=2)).init,
                                jax.random.key(0))
    head = SequenceClassifier(config, 3, family.pooling, family.backbone)
    ids = jnp.zeros((1, 8), jnp.int32)
    tuned = jax.eval_shape(lambda: nn.unbox(head.init(jax.random.key(0), ids, ids, ids > -1))["params"])
    shapes = lambda tree: {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
    ours = shapes(tuned["encoder"])
    assert shapes(nn.unbox(pretrained)["encoder"]).items() <= ours.items()


@pytest.mark.parametrize("name", families.names())
def test_a_sequence_past_the_learned_positions_is_refused(name):
    """Rows longer than a learned position table are a one-line error naming model.max_position_embeddings in
    every family that has one; an encoder's lookup once read past the table's end and gave NaN (a gather) or
    zeros (a table of 16 rows or fewer, looked up one-hot). Relative and rotary positions have no table."""
    preset = min((p for p, c in PRESETS.items() if c.family == name), key=lambda p: PRESETS[p].hidden_size)
    config = model_config(preset, max_position_embeddings=32, num_layers=1, dtype="float32")
    init = families.make_objective(config, DataConfig(max_seq_length=40, max_predictions=2)).init
    if config.position_embedding != "learned":
        jax.eval_shape(init, jax.random.key(0))
        return
    with pytest.raises(ValueError, match=r"input_ids has length \d+, but model.max_position_embeddings=32 holds"):
        jax.eval_shape(init, jax.random.key(0))
