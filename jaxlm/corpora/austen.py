"""Jane Austen's novels as the R package janeaustenr stores them (one line of the book per element),
cut into chapters of sentences."""
from __future__ import annotations

import re

from jaxlm.corpora.text import split_sentences

_CHAPTER = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\.?\s*$", re.I)
_VOLUME = re.compile(r"^\s*volume\s+([0-9]+|[ivxlc]+)\.?\s*$", re.I)
_BACK_MATTER = re.compile(r"^\s*(the end|finis|a note on the text)\s*$", re.I)


def austen_chapters(lines: list[str]) -> list[list[str]]:
    """Chapters of one novel (one line of the book per element) as lists of sentences, without
    front matter, headings, back matter, editorial notes and _emphasis_/asterisk markup."""
    chapters: list[list[str]] = []
    paragraph: list[str] = []

    def flush():
        text = " ".join(paragraph).replace("_", "").replace("*", "").strip()
        is_editorial_note = text.startswith("[") and text.endswith("]")
        if chapters and re.search(r"[A-Za-z]", text) and not is_editorial_note:
            chapters[-1].extend(split_sentences(text))
        paragraph.clear()

    for line in lines:
        if _BACK_MATTER.match(line):
            break
        if _CHAPTER.match(line) or _VOLUME.match(line) or not line.strip():
            flush()
            if _CHAPTER.match(line):
                chapters.append([])
        else:
            paragraph.append(line.strip())
    flush()
    return [c for c in chapters if c]
