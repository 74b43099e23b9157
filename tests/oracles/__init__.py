"""Test oracles: pure-Python tokenizers written apart from the Rust and sentencepiece libraries the package runs."""
