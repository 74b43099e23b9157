"""Named model sizes (BERT's published shapes) as TransformerConfig presets."""
from __future__ import annotations

import dataclasses

from jaxlm.models.config import TransformerConfig

PRESETS: dict[str, TransformerConfig] = {
    "bert-tiny": TransformerConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512),
    "bert-mini": TransformerConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "bert-base": TransformerConfig(),
    "bert-large": TransformerConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
}


def model_config(preset: str | None = None, **overrides) -> TransformerConfig:
    """A preset with field overrides; unknown presets or fields raise with the valid names."""
    if preset is None:
        base = TransformerConfig()
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise ValueError(f"unknown model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    valid = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise ValueError(f"unknown model keys {unknown}; valid keys: preset, {', '.join(sorted(valid))}")
    return dataclasses.replace(base, **overrides)
