"""Tokenizers behind one interface (rust.py, spm.py) and one resolver (load.py); their roles and WordPiece training."""
