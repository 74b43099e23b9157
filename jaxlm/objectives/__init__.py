"""jaxlm.objectives."""
