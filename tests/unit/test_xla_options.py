"""The XLA options jaxlm sets per platform, and every program over batches of rows compiling with them."""
import dataclasses
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from jaxlm import config as config_lib
from jaxlm import sentence_embedding
from jaxlm.eval import Item, loglikelihoods, scoring
from jaxlm.finetune import run as finetune_run
from jaxlm.finetune.tasks import TASKS, Context
from jaxlm.models import BertForPreTraining, CausalLM, model_config
from jaxlm.parallel import xla_options
from jaxlm.train import loop

UNKNOWN = {"xla_no_such_option": True}  # XLA refuses it by name: a compile that raises was given the options


def test_xla_merges_no_dots_on_gpus_unless_xla_flags_name_the_passes(monkeypatch):
    gpu = types.SimpleNamespace(platform="gpu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert xla_options.project_xla_options([gpu]) == {"xla_disable_hlo_passes": "dot-merger"}
    assert xla_options.project_xla_options(jax.devices()) == {}  # the CPU's
    monkeypatch.setenv("XLA_FLAGS", "--xla_disable_hlo_passes=")  # the user's choice of passes: none disabled
    assert xla_options.project_xla_options([gpu]) == {}


def refuse_with_unknown_options(monkeypatch, module):
    devices_seen = []

    def options(devices):
        devices_seen.append(list(devices))
        return UNKNOWN

    monkeypatch.setattr(module, "project_xla_options", options)
    return devices_seen


def test_a_fine_tunes_forward_pass_compiles_with_the_projects_options(monkeypatch):
    config = config_lib.load("configs/bert-tiny.yaml", ["train.global_batch=8", "mesh.data=-1"])
    config = dataclasses.replace(config, finetune=dataclasses.replace(config.finetune, task="sequence_classification",
                                                                      max_length=16, labels=("no", "yes")))
    task = TASKS["sequence_classification"]
    setup = loop.build(config, objective=task.objective(Context(config.model, config.finetune, ("no", "yes"), None)))
    seen = refuse_with_unknown_options(monkeypatch, finetune_run)
    with pytest.raises(Exception, match="xla_no_such_option"):
        finetune_run.Runner(setup, task)
    assert seen == [list(setup.mesh.devices.flat)]


def test_eval_scoring_and_sentence_embeddings_compile_with_the_projects_options(monkeypatch):
    config = model_config("llama-tiny", vocab_size=96, max_position_embeddings=16, dtype="float32")
    params = nn.unbox(CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
    seen = refuse_with_unknown_options(monkeypatch, scoring)
    with pytest.raises(Exception, match="xla_no_such_option"):
        loglikelihoods(config, params, [Item((1, 2), (5, 6))])
    scoring.compiled_scorer.cache_clear()  # its entry holds the refused options
    assert seen and all(devices == jax.devices() for devices in seen)

    encoder = model_config("bert-tiny", vocab_size=96, max_position_embeddings=16, dtype="float32")
    ids = jnp.zeros((1, 4), jnp.int32)
    params = nn.unbox(BertForPreTraining(encoder).init(jax.random.key(0), ids, ids, ids > -1,
                                                       jnp.zeros((1, 1), jnp.int32)))["params"]
    seen = refuse_with_unknown_options(monkeypatch, sentence_embedding)
    with pytest.raises(Exception, match="xla_no_such_option"):
        sentence_embedding.embed(encoder, params, [[1, 5, 6, 2]])
    assert seen == [jax.devices()]
