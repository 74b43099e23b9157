"""jaxlm.convert."""
