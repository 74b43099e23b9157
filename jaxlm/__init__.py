"""jaxlm: pretraining language models in JAX/Flax on a device mesh."""
