"""One resolver for checkpoint paths: a run directory, its checkpoints/ directory, one step directory
and a converted checkpoint all open the same way, for `train.init_from` and for reading."""
import dataclasses

import jax
import numpy as np
import pytest

from jaxlm.convert import store
from jaxlm.models.presets import model_config
from jaxlm.train import checkpoint

CONFIG = model_config("bert-tiny", vocab_size=64, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)


def params(value: float) -> dict:
    return {"encoder": {"kernel": np.full((2, 3), value, np.float32)}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory with committed steps 10 and 20 (their params filled with 10.0 and 20.0)."""
    run = tmp_path_factory.mktemp("run")
    mngr = checkpoint.manager(run / "checkpoints", keep=5, async_save=False)
    for step in (10, 20):
        checkpoint.save(mngr, step, {"params": params(float(step))}, {"step": step},
                        {"model": dataclasses.asdict(CONFIG)})
    mngr.wait_until_finished()
    mngr.close()
    return run


def abstract() -> dict:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params(0.0))


@pytest.mark.parametrize("form, step", [("run", 20), ("checkpoints", 20), ("checkpoints/10", 10)])
def test_every_form_of_a_run_path_resolves_to_its_step(run_dir, form, step):
    path = run_dir if form == "run" else run_dir / form
    with checkpoint.open_checkpoint(path) as (mngr, found):
        assert found == step and mngr.directory == (run_dir / "checkpoints").absolute()
    restored = checkpoint.restore_params(path, abstract())
    assert float(restored["encoder"]["kernel"][0, 0]) == step
    config, loaded, _ = store.load_checkpoint(path)
    assert config == CONFIG and float(loaded["encoder"]["kernel"][0, 0]) == step


def test_a_converted_checkpoint_resolves_to_step_0(tmp_path):
    out = store.save_converted(tmp_path / "converted", CONFIG, params(3.0))
    with checkpoint.open_checkpoint(out) as (_, step):
        assert step == 0
    assert float(checkpoint.restore_params(out, abstract())["encoder"]["kernel"][0, 0]) == 3.0
    assert float(store.load_checkpoint(out)[1]["encoder"]["kernel"][0, 0]) == 3.0


def test_an_explicit_step_wins_and_empty_or_missing_paths_are_refused(run_dir, tmp_path):
    assert float(checkpoint.restore_params(run_dir, abstract(), step=10)["encoder"]["kernel"][0, 0]) == 10
    with pytest.raises(FileNotFoundError, match="no checkpoint directory at"):
        checkpoint.resolve(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="train.init_from=.*no checkpoint found there"):
        checkpoint.restore_params(tmp_path / "empty", abstract())
    with pytest.raises(ValueError, match="is not a jaxlm checkpoint: it holds no Orbax checkpoint step"):
        store.load_checkpoint(tmp_path / "empty")
