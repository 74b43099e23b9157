"""jaxlm.parallel."""
