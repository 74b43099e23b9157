"""Every preset has exactly the parameters of the same architecture built by transformers (on the meta
device, so nothing is allocated): the published shapes, counted by an implementation nobody here wrote."""
from __future__ import annotations

import dataclasses

import jax
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxlm import families  # noqa: E402
from jaxlm.config import DataConfig  # noqa: E402
from jaxlm.models.presets import PRESETS  # noqa: E402

# Our pretraining model per family, and the transformers class with the same parts.
HF_CLASS = {"bert": "BertForPreTraining", "roberta": "RobertaForMaskedLM", "albert": "AlbertForPreTraining",
            "distilbert": "DistilBertForMaskedLM", "spanbert": "BertForMaskedLM", "gpt2": "GPT2LMHeadModel",
            "llama": "LlamaForCausalLM", "t5": "T5ForConditionalGeneration", "bart": "BartForConditionalGeneration"}
# Published totals of the Hugging Face models, for the printout.
PUBLISHED_MILLIONS = {"bert-base": 110, "bert-large": 336, "roberta-base": 125, "albert-base": 12,
                      "distilbert-base": 67, "spanbert-base": 108, "gpt2-small": 124, "gpt2-medium": 355,
                      "smollm2-135m": 135, "t5-small": 60, "t5-base": 223, "bart-base": 139}


def ours(config) -> dict:
    objective = families.make_objective(config, DataConfig(max_seq_length=16, max_predictions=2, max_target_length=8))
    return jax.eval_shape(objective.init, jax.random.key(0))


def count(tree) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(tree))


def theirs(config) -> int:
    family = "bert" if config.family == "spanbert" else config.family
    hf_config = families.get(family).converter("config_to_hf")(dataclasses.replace(config, family=family))
    hf = transformers.AutoConfig.for_model(**hf_config)
    with torch.device("meta"):
        model = getattr(transformers, HF_CLASS[config.family])(hf)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_matches_transformers_parameter_count(preset):
    config = PRESETS[preset]
    params = ours(config)
    total = count(params)
    expected = theirs(config)
    if config.family == "spanbert":
        total -= count(params["sbo"])  # SpanBERT's boundary head has no transformers counterpart
    if config.family == "bart":
        expected += config.vocab_size  # transformers keeps final_logits_bias as a buffer, we as a parameter
    print(f"{preset}: {total:,} parameters (transformers {expected:,}; "
          f"published ~{PUBLISHED_MILLIONS.get(preset, '?')}M)")
    assert total == expected
