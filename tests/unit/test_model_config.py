"""A model config's sizes and dropouts are checked before anything is built: one line that names the field."""
import pytest

from jaxlm.models.config import DROPOUTS, POSITIVE_SIZES, SIZES_OR_ZERO
from jaxlm.models.presets import PRESETS, model_config


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_is_valid(preset):
    model_config(preset).validate()


@pytest.mark.parametrize(("field", "value", "expected"), [
    *((name, 0, f"model.{name}=0 must be positive") for name in POSITIVE_SIZES),
    ("num_layers", -1, "model.num_layers=-1 must be positive"),
    *((name, -1, f"model.{name}=-1 must be 0 or positive") for name in SIZES_OR_ZERO),
    *((name, value, f"model.{name}={value} must lie in [0, 1)") for name in DROPOUTS for value in (1.0, -0.1)),
])
def test_a_size_or_dropout_out_of_range_is_named(field, value, expected):
    # num_heads=0 once reached `hidden_size % num_heads` first: a ZeroDivisionError's traceback
    with pytest.raises(ValueError) as refused:
        model_config("bert-base", **{field: value}).validate()
    assert str(refused.value).startswith(expected)
