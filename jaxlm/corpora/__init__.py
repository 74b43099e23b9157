"""Demo assets apart from the library: corpora fetched from package registries and cleaned into BERT
text (registry.py names each once), model, tokenizer and labelled-data files (models.py), and the
TFDS demo builder."""
