"""model.fused_projections: on GPUs, with XLA's attention, queries, keys and values (and the gated MLP's gate and
up) as one matmul of their stacked kernels create the separate projections' parameters and give their outputs, loss
and gradients; on a CPU they stay separate. (That XLA's dot merger is off on GPUs: test_xla_options.)"""
import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import outputs_loss_and_gradients
from jaxlm import families
from jaxlm.convert.names import flatten
from jaxlm.data.settings import DataConfig
from jaxlm.models.presets import PRESETS, model_config
from jaxlm.nn import layers

DATA = DataConfig(max_seq_length=16, max_predictions=3)
# bert: queries, keys and values with biases; llama-gqa: grouped heads, so keys and values alone, and the gated
# MLP; t5: cross-attention's keys and values, from the encoder's states
CASES = {"bert": {}, "gpt2": {}, "llama": {}, "llama-gqa": {"num_heads": 4, "num_kv_heads": 2}, "t5": {},
         "bart": {}}


def tiny(case: str):
    family = case.split("-")[0]
    preset = next(p for p, c in PRESETS.items() if c.family == family)
    sizes = {"num_heads": 2, "num_kv_heads": 0, **CASES[case]}
    return model_config(preset, vocab_size=120, hidden_size=32, intermediate_size=64, num_layers=1, dtype="float32",
                        hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, **sizes)


def matmuls(config, params, batch) -> int:
    objective = families.make_objective(config, DATA)
    jaxpr = jax.make_jaxpr(lambda p: objective.apply(p, batch, None, deterministic=True))(params)
    return str(jaxpr).count("dot_general")


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_projections_match_the_separate_ones(case, monkeypatch):
    fused = tiny(case)
    separate = dataclasses.replace(fused, fused_projections=False)
    assert fused.fused_projections
    params = nn.unbox(families.make_objective(fused, DATA).init(jax.random.key(0)))
    separate_params = nn.unbox(families.make_objective(separate, DATA).init(jax.random.key(0)))
    names = dict(flatten(params))
    assert names.keys() == dict(flatten(separate_params)).keys()
    assert any(path.endswith("value/kernel") for path in names)
    jax.tree.map(np.testing.assert_array_equal, params, separate_params)

    batch = families.make_objective(fused, DATA).synthetic_batch(2, seed=0)
    assert matmuls(separate, params, batch) == matmuls(fused, params, batch)  # the CPU's
    monkeypatch.setattr(layers, "target_platform", lambda: "gpu")
    # one matmul for the three of self-attention (keys and values with grouped heads or across), one for two
    fewer = {"bert": 2, "gpt2": 2, "llama": 3, "llama-gqa": 2, "t5": 5, "bart": 5}[case]
    assert matmuls(separate, params, batch) - matmuls(fused, params, batch) == fewer
    outputs, loss, grads = outputs_loss_and_gradients(fused, DATA, params, batch)
    separate_outputs, separate_loss, separate_grads = outputs_loss_and_gradients(separate, DATA, params, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outputs, separate_outputs)
    np.testing.assert_allclose(loss, separate_loss, rtol=1e-6)
    for path, grad in grads.items():
        assert np.abs(grad).max() > 0 or "bias" in path, path
        np.testing.assert_allclose(grad, separate_grads[path], rtol=1e-4, atol=1e-6, err_msg=path)
