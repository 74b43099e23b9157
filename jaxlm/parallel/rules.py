"""Logical-axis rules: the short table that maps model axis names to mesh axes, per preset."""
from __future__ import annotations

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

MESH_AXES = ("data", "fsdp", "tensor")

# factor: ALBERT's narrow embedding width; relpos: T5's relative-position buckets.
LOGICAL_AXES = ("batch", "length", "embed", "embed_out", "heads", "kv_heads", "kv", "mlp", "vocab",
                "segment", "classes", "layers", "factor", "relpos")


def _rules(**placed) -> Rules:
    """Every logical axis replicated, the batch split over data and fsdp, then `placed` on top."""
    table = {name: None for name in LOGICAL_AXES} | {"batch": ("data", "fsdp")} | placed
    return tuple(table.items())


PRESETS: dict[str, Rules] = {
    "dp": _rules(),
    "fsdp": _rules(embed="fsdp"),
    "fsdp_tp": _rules(embed="fsdp", embed_out="tensor", heads="tensor", mlp="tensor", vocab="tensor"),
}


def rules_for(name: str) -> Rules:
    if name not in PRESETS:
        raise ValueError(f"unknown sharding rules {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def mesh_axes_for(rules: Rules, logical: tuple[str | None, ...]) -> tuple:
    """The mesh axes a logical name tuple maps to (None = replicated), as flax resolves them."""
    table = dict(rules)
    return tuple(table.get(name) if name is not None else None for name in logical)
