"""jaxlm.data."""
