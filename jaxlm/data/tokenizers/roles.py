"""Which ids play which role (pad, CLS/BOS, SEP/EOS, mask, unknown, sentinels) and which pieces begin
a word, for every tokenizer we load; the objectives read these, never a tokenizer's class."""
from __future__ import annotations

import numpy as np

from jaxlm.data.tokenizers.spm import SentencePieceTokenizer

ROLES = ("pad", "cls", "sep", "bos", "eos", "mask", "unk")
# role -> the spellings of its token, the first one in the vocabulary wins: BERT's WordPiece names,
# RoBERTa's and BART's BPE names, and GPT-2's only special token (<|endoftext|>) standing in for three
ROLE_TOKENS = {
    "pad": ("[PAD]", "<pad>", "<|endoftext|>"),
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "bos": ("<s>", "[CLS]", "<|endoftext|>"),
    "eos": ("</s>", "[SEP]", "<|endoftext|>"),
    "mask": ("[MASK]", "<mask>"),
    "unk": ("[UNK]", "<unk>"),
}


def _lookup(lookup, *names: str) -> int | None:
    for name in names:
        i = lookup(name)
        if i is not None and i >= 0:
            return int(i)
    return None


def _first(*ids: int | None) -> int | None:
    return next((i for i in ids if i is not None), None)


def special_ids(tokenizer) -> dict[str, int | None]:
    """Role -> id (None where the tokenizer has no such token); `sentinels` lists T5's sentinel ids."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        sp = tokenizer.sp
        piece = lambda name: sp.piece_to_id(name) if sp.piece_to_id(name) != sp.unk_id() else None
        own = lambda i: i if i >= 0 else None
        bos, eos = own(sp.bos_id()), own(sp.eos_id())
        # ALBERT's model holds [CLS] [SEP] [MASK] <pad> as pieces; T5's has pad/eos ids and no BOS
        roles = {"pad": own(sp.pad_id()) if sp.pad_id() >= 0 else _lookup(piece, "<pad>"),
                 "cls": _first(_lookup(piece, "[CLS]"), bos), "sep": _first(_lookup(piece, "[SEP]"), eos), "bos": bos,
                 "eos": eos, "mask": _lookup(piece, "<mask>", "[MASK]"), "unk": own(sp.unk_id())}
        return roles | {"sentinels": [tokenizer.sentinel_id(i) for i in range(tokenizer.sentinels)]}
    roles = {role: _lookup(tokenizer.token_to_id, *names) for role, names in ROLE_TOKENS.items()}
    return roles | {"sentinels": []}


def sentinel_ids(tokenizer) -> list[int]:
    """T5's sentinel ids: a SentencePiece model's (`special_ids`), or a tokenizer.json's `<extra_id_0>`,
    `<extra_id_1>`, ... for as long as it has them (a converted T5 tokenizer)."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        return special_ids(tokenizer)["sentinels"]
    found = []
    while (i := tokenizer.token_to_id(f"<extra_id_{len(found)}>")) is not None:
        found.append(i)
    return found


def word_start_table(tokenizer) -> np.ndarray:
    """bool[vocab_size]: True for pieces that begin a word (WordPiece: no "##"; byte-level BPE:
    a leading space "Ġ"; SentencePiece: a leading "▁"). Sentence-initial BPE pieces carry no space,
    so the pipelines also treat every stored sentence start as a word start."""
    pieces = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
    if tokenizer.continuation_prefix:
        return np.array([not p.startswith(tokenizer.continuation_prefix) for p in pieces])
    marker = tokenizer.word_marker
    return np.array([p.startswith(marker) or (p.startswith("<") and p.endswith(">")) for p in pieces])
