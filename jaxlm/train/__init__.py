"""jaxlm.train."""
