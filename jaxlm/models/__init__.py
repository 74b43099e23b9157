"""jaxlm.models."""
