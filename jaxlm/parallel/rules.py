"""Logical-axis rules: the short table that maps model axis names to mesh axes, per preset."""
from __future__ import annotations

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

MESH_AXES = ("data", "fsdp", "tensor")

_DP: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", None),
    ("embed_out", None),
    ("heads", None),
    ("kv", None),
    ("mlp", None),
    ("vocab", None),
    ("segment", None),
    ("classes", None),
    ("layers", None),
)

_FSDP: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("embed_out", None),
    ("heads", None),
    ("kv", None),
    ("mlp", None),
    ("vocab", None),
    ("segment", None),
    ("classes", None),
    ("layers", None),
)

_FSDP_TP: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("embed_out", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("segment", None),
    ("classes", None),
    ("layers", None),
)

PRESETS: dict[str, Rules] = {"dp": _DP, "fsdp": _FSDP, "fsdp_tp": _FSDP_TP}


def rules_for(name: str) -> Rules:
    if name not in PRESETS:
        raise ValueError(f"unknown sharding rules {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def mesh_axes_for(rules: Rules, logical: tuple[str | None, ...]) -> tuple:
    """The mesh axes a logical name tuple maps to (None = replicated), as flax resolves them."""
    table = dict(rules)
    return tuple(table.get(name) if name is not None else None for name in logical)
