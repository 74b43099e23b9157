"""A stack of identical layers: a Python loop over layer_0..layer_{N-1}, or one nn.scan over stacked
parameters (leading "layers" axis), each with the remat policy the config names."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import flax.linen as nn
import jax

if TYPE_CHECKING:
    from jaxlm.models.config import TransformerConfig

REMAT_POLICIES = {"full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims}


def scan_body(layer_cls: type[nn.Module]) -> type[nn.Module]:
    """`layer_cls` with scan's calling convention: (carry, *args) -> (carry, None)."""

    class ScanBody(layer_cls):
        def __call__(self, x, *args):
            return super().__call__(x, *args), None

    ScanBody.__name__ = layer_cls.__name__
    return ScanBody


def make_layers(layer_cls: type[nn.Module], config: TransformerConfig, count: int, *, static_args: Sequence[int] = (),
                name: str = "layer", **layer_kwargs):
    """Call from a parent's `setup`: `count` layers named `{name}_{i}`, or one scanned module named
    `{name}s` when `config.scan_layers`. `static_args` are the positions (self = 0) of the layer's
    Python-valued arguments (e.g. `deterministic`), which remat must not trace. Run with `run_layers`."""
    if config.scan_layers:
        layer_cls = scan_body(layer_cls)
    if config.remat != "none":
        layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[config.remat], prevent_cse=not config.scan_layers,
                             static_argnums=tuple(static_args))
    if not config.scan_layers:
        return [layer_cls(config, name=f"{name}_{i}", **layer_kwargs) for i in range(count)]
    scanned = nn.scan(layer_cls, variable_axes={"params": 0, "cache": 0},
                      split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast, length=count,
                      metadata_params={nn.PARTITION_NAME: "layers"})
    return scanned(config, name=f"{name}s", **layer_kwargs)


def run_layers(layers, x: jax.Array, *args) -> jax.Array:
    """x through every layer of `make_layers`'s result; `args` go unchanged to each layer."""
    if isinstance(layers, (list, tuple)):
        for layer in layers:
            x = layer(x, *args)
        return x
    x, _ = layers(x, *args)
    return x
