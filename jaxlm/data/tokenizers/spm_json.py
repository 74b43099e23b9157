"""A SentencePiece model as a Hugging Face `tokenizers` pipeline (a tokenizer.json) that gives the same ids.

transformers reads a .model only through a model family's class, each with its own assumptions (T5's puts
100 sentinels after the model and its unk at id 2, Llama's wants the file named tokenizer.model, ALBERT's
lowercases), so an exported run carries this instead. The `tokenizers` package reads no .model file itself
(`SentencePieceUnigramTokenizer.from_spm` wants a protobuf module on sys.path and handles unigram only):
the model proto, which `sentencepiece` ships a parser for, says all that the pipeline needs.
"""
from __future__ import annotations

from pathlib import Path

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

Trainer, Piece = sentencepiece_model_pb2.TrainerSpec, sentencepiece_model_pb2.ModelProto.SentencePiece
WORD_MARKER = "▁"


def read_model(path) -> sentencepiece_model_pb2.ModelProto:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    return proto


def bpe_merges(pieces: list[str]) -> list[tuple[str, str]]:
    """The merges a BPE model applies, highest priority first. SentencePiece's BPE joins the adjacent pair
    whose union is the best-scoring piece, and its pieces are stored best first, so a merge ranks by the
    id of the piece it makes (then by its parts' ids, which never decides between real alternatives)."""
    rank = {piece: i for i, piece in enumerate(pieces)}
    merges = []
    for piece in pieces:
        splits = [(piece[:cut], piece[cut:]) for cut in range(1, len(piece))]
        merges += sorted(((left, right) for left, right in splits if left in rank and right in rank),
                         key=lambda pair: (rank[pair[0]], rank[pair[1]]))
    return merges


def to_tokenizers(path, sentinels: int = 0) -> Tokenizer:
    """The `tokenizers` pipeline of the SentencePiece model at `path`, with T5's `sentinels` extra ids after
    it (`<extra_id_i>` is the i-th from the end, as `SentencePieceTokenizer` numbers them). It adds no
    special tokens to encoded text, as `SentencePieceTokenizer` does not."""
    proto = read_model(path)
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    pieces = [p.piece for p in proto.pieces]
    if trainer.model_type == Trainer.UNIGRAM:
        model = models.Unigram([(p.piece, p.score) for p in proto.pieces], trainer.unk_id, trainer.byte_fallback)
    elif trainer.model_type == Trainer.BPE:
        model = models.BPE({piece: i for i, piece in enumerate(pieces)}, bpe_merges(pieces),
                           unk_token=pieces[trainer.unk_id], fuse_unk=True, byte_fallback=trainer.byte_fallback)
    else:
        raise ValueError(f"{path}: a SentencePiece model of type {trainer.model_type} (char or word); only unigram "
                         "and BPE models can be exported as a tokenizer.json")
    if trainer.treat_whitespace_as_suffix or not normalizer.escape_whitespaces:
        raise ValueError(f"{path}: a SentencePiece model trained with treat_whitespace_as_suffix or without "
                         "escape_whitespaces cannot be exported as a tokenizer.json")
    tokenizer = Tokenizer(model)
    steps = [normalizers.Precompiled(normalizer.precompiled_charsmap)] if normalizer.precompiled_charsmap else []
    if normalizer.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(r"\A | \z"), "")]
    tokenizer.normalizer = normalizers.Sequence(steps)
    prepend = "always" if normalizer.add_dummy_prefix else "never"
    # sentencepiece splits words at spaces unless its model holds pieces of spaces alone (Llama's "▁▁")
    split = trainer.split_by_whitespace and not trainer.allow_whitespace_only_pieces
    words = pre_tokenizers.Metaspace(WORD_MARKER, prepend, split=split)
    tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([words, pre_tokenizers.Digits(individual_digits=True)])
                               if trainer.split_digits else words)
    metaspace = decoders.Metaspace(WORD_MARKER, prepend)
    tokenizer.decoder = (decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), metaspace])
                         if trainer.byte_fallback else metaspace)
    tokenizer.add_special_tokens([AddedToken(p.piece, special=True, normalized=False)
                                  for p in proto.pieces if p.type in (Piece.UNKNOWN, Piece.CONTROL)])
    tokenizer.add_special_tokens([AddedToken(f"<extra_id_{i}>", special=True, normalized=False)
                                  for i in reversed(range(sentinels))])
    return tokenizer


def frame(tokenizer: Tokenizer, first: int | None, last: int | None) -> None:
    """Makes `add_special_tokens=True` put the tokens `first` and `last` (ids, None for none) around a text; a pair
    as BERT frames one, `first` A `last` B `last`, with B and its `last` of token type 1."""
    if first is None and last is None:
        return
    ends = {i: tokenizer.id_to_token(i) for i in (first, last) if i is not None}
    before, after = [ends[first]] if first is not None else [], [ends[last]] if last is not None else []
    single = " ".join([*before, "$A", *after])
    pair = " ".join([single, "$B:1", *[f"{t}:1" for t in after]])
    tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                             special_tokens=[(t, i) for i, t in ends.items()])
