"""jaxlm.nn."""
