"""train.dropout_rng: the step's dropout masks hashed from each element's index (the default), from threefry
(bit-identical to the key of train.seed) or from XLA's RngBitGenerator; each is deterministic, and they differ."""
import jax
import numpy as np
import pytest

from jaxlm import config as config_lib
from jaxlm.config import ConfigError
from jaxlm.nn.dropout import is_hashed
from jaxlm.train.loop import build, compile_steps, global_batch
from jaxlm.train.state import create_state
from jaxlm.train.step import dropout_key

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.dtype=float32", "model.hidden_dropout=0.1", "model.attention_dropout=0.1", "train.global_batch=8",
        "data.max_seq_length=32", "data.max_predictions=5"]


def _two_runs(dropout_rng: str, steps: int = 2) -> list[list[float]]:
    """The losses of two runs of `steps` steps from the same initial state."""
    config = config_lib.load("configs/bert-tiny.yaml", [*TINY, f"train.dropout_rng={dropout_rng}"])
    setup = build(config, devices=jax.devices()[:1])  # one device: the test is of the generators
    compiled_train, _ = compile_steps(setup, with_eval=False)
    batch = global_batch(setup, setup.objective.synthetic_batch(8, seed=0))
    runs = []
    for _ in range(2):
        state = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules,
                             jax.random.key(0))
        losses = []
        for _ in range(steps):
            state, metrics = compiled_train(state, batch, dropout_key(config.train))
            losses.append(float(metrics["loss"]))
        runs.append(losses)
    return runs


def test_threefry_key_is_the_seed_key_and_the_default_hashes():
    train = config_lib.load("configs/bert-tiny.yaml", ["train.seed=7", "train.dropout_rng=threefry"]).train
    np.testing.assert_array_equal(jax.random.key_data(dropout_key(train)), jax.random.key_data(jax.random.key(7)))
    assert is_hashed(dropout_key(config_lib.load("configs/bert-tiny.yaml", []).train))


def test_each_generator_is_deterministic_and_they_draw_different_masks():
    (threefry, threefry_again), (rbg, rbg_again), (hashed, hashed_again) = map(_two_runs, ("threefry", "rbg", "hash"))
    assert threefry == threefry_again and rbg == rbg_again and hashed == hashed_again
    assert len({threefry[0], rbg[0], hashed[0]}) == 3, "a different generator draws different dropout masks"
    np.testing.assert_allclose(threefry, rbg, rtol=0.05)
    np.testing.assert_allclose(threefry, hashed, rtol=0.05)


def test_unknown_generator_is_a_config_error():
    with pytest.raises(ConfigError, match="train.dropout_rng='philox'; choose one of threefry, rbg, hash"):
        config_lib.load("configs/bert-tiny.yaml", ["train.dropout_rng=philox"])
