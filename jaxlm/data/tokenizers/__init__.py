"""jaxlm.data.tokenizers."""
