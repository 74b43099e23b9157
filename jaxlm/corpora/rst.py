"""reStructuredText (Sphinx/kernel-doc flavoured) to plain English prose documents, and reST files to BERT text."""
from __future__ import annotations

import pathlib
import re
import zlib
from typing import Callable, Iterable

from jaxlm.corpora.text import format_documents, split_sentences

# Directives whose argument text and indented body are prose (the admonitions).
_ADMONITIONS = frozenset(
    "note warning tip hint important caution attention danger error seealso todo impl-detail "
    "epigraph".split()
)
# Directives whose first argument is a version number; the rest of the argument and the body are prose.
_VERSIONED = frozenset("versionadded versionchanged deprecated deprecated-removed".split())
# Directives whose header (signature lines, arguments, options) is dropped but whose body is prose:
# object descriptions (Python, C and C++ domains) and plain containers.
_DESCRIPTIONS = frozenset(
    "function class method attribute data exception decorator decoratormethod classmethod "
    "staticmethod abstractmethod coroutinefunction coroutinemethod awaitablefunction "
    "awaitablemethod property module object describe cmdoption option envvar opcode pdbcommand "
    "2to3fixer macro member type var struct union enum enumerator func "
    "topic admonition glossary only hlist container sidebar ifconfig".split()
)

_DIRECTIVE = re.compile(r"^\.\.\s+([A-Za-z0-9][\w:+.-]*)::(?:\s+(.*))?$")
_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}\s*$")
_SIMPLE_TABLE_BORDER = re.compile(r"^[=-]{2,}(?: +[=-]{2,})+\s*$")
_GRID_TABLE_BORDER = re.compile(r"^\+[-=+]{2,}\+?\s*$")
_FIELD = re.compile(r"^:(?:[^:`\s\\]|\\.)(?:[^:`\\]|\\.)*:(?:\s|$)")
_BULLET = re.compile(r"^([-*+\u2022\u2023\u2043])(?:\s+|$)")
_ENUMERATOR = re.compile(r"^(?:\(?(?:[0-9]+|[a-zA-Z]|#|[ivxlcdm]+|[IVXLCDM]+)\)|(?:[0-9]+|[a-zA-Z]|#|[ivxlcdm]+|[IVXLCDM]+)\.)(?:\s+|$)")
_OPTION = re.compile(r"^--?[A-Za-z0-9]")

# Roles whose target is an object name: ``~a.b.c`` shows ``c``, otherwise the whole name.
_REF_ROLES = frozenset("ref doc numref keyword".split())
_LITERAL = re.compile(r"``(.+?)``")
_ROLE = re.compile(r"(?<![\w`]):((?:[\w+-]+:)?[\w+-]+):`((?:[^`\\]|\\.)+)`(?!`)")
_INTERPRETED = re.compile(r"(?<![\w`])`((?:[^`\\]|\\.)+)`(?:__?)?(?![\w`])")
_EXPLICIT_TARGET = re.compile(r"^(.*?)\s*<[^<>]*>$", re.S)
_FOOTNOTE_REF = re.compile(r"\s*\[(?:#[\w-]*|\*|[0-9]+|[A-Za-z][\w.-]*)\]_")
_NAMED_REF = re.compile(r"(?<![\w\\])([A-Za-z0-9](?:[A-Za-z0-9]|[-.](?=[A-Za-z0-9]))*)__?(?![\w])")
_STRONG = re.compile(r"(?<![\w*\\])\*\*(\S(?:.*?\S)?)\*\*(?![\w*])")
_EMPHASIS = re.compile(
    r"(?<![\w*\\])\*((?:[^\s*\\]|\\.)(?:(?:[^*\\]|\\.)*?(?:[^\s*\\]|\\.))?)\*(?![\w*])")
_SUBSTITUTION = re.compile(r"(?<![\w|])\|([^|\s](?:[^|]*?\S)?)\|(?:__?)?(?![\w|])")
_INLINE_TARGET = re.compile(r"_`([^`]+)`")
_PLACEHOLDER = re.compile("\x00([0-9]+)\x00")

_RESIDUE = re.compile(r"``|:\w+:`|(?:^|\s)\.\. |::$|={4}|-{4}|\+-{3}|\x00")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _role_text(match: re.Match) -> str:
    role, content = match.group(1), match.group(2)
    explicit = _EXPLICIT_TARGET.match(content)
    if explicit and explicit.group(1):
        return explicit.group(1)
    content = content.replace("\\", "")
    name = role.split(":")[-1]
    if name in ("pep", "PEP"):
        return f"PEP {content.split('#')[0]}"
    if name in ("rfc", "RFC"):
        return f"RFC {content.split('#')[0]}"
    if name in ("issue", "gh"):
        return f"{'bpo' if name == 'issue' else 'gh'}-{content}"
    if name == "abbr":
        return content.split(" (")[0]
    if name in _REF_ROLES:
        last = content.rstrip("/").split("/")[-1]
        last = re.sub(r"\.(rst|txt)$", "", last)
        return re.sub(r"[-_]+", " ", last).strip()
    if content.startswith("~"):
        return re.split(r"[.:]+", content[1:].rstrip("()"))[-1] + ("()" if content.endswith("()") else "")
    return content.lstrip("!.")


def _interpreted_text(match: re.Match) -> str:
    explicit = _EXPLICIT_TARGET.match(match.group(1))
    if explicit and explicit.group(1):
        return explicit.group(1)
    return match.group(1)


def inline_text(text: str) -> str:
    """Inline markup of one paragraph as plain text: ``literal`` -> literal, :role:`text <target>`
    -> text, :role:`~a.b` -> b, `link <url>`_ -> link, *emphasis* / **strong** -> text, footnote
    and citation references removed, |substitution| -> its name, backslash escapes resolved."""
    literals: list[str] = []

    def keep(value: str) -> str:
        literals.append(value)
        return f"\x00{len(literals) - 1}\x00"

    text = _LITERAL.sub(lambda m: keep(m.group(1)), text)
    text = _ROLE.sub(lambda m: keep(_role_text(m)), text)
    text = _INLINE_TARGET.sub(lambda m: keep(m.group(1)), text)
    text = _FOOTNOTE_REF.sub("", text)
    text = _INTERPRETED.sub(lambda m: keep(_interpreted_text(m)), text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _SUBSTITUTION.sub(r"\1", text)
    text = _NAMED_REF.sub(r"\1", text)
    text = re.sub(r"\\(\s)", "", text)
    text = re.sub(r"\\(.)", r"\1", text)
    while _PLACEHOLDER.search(text):
        text = _PLACEHOLDER.sub(lambda m: literals[int(m.group(1))], text)
    return " ".join(text.split())


def is_prose(sentence: str, min_words: int = 3) -> bool:
    """At least ``min_words`` words, mostly letters, and no leftover reST markup."""
    if len(sentence.split()) < min_words or _RESIDUE.search(sentence):
        return False
    visible = [c for c in sentence if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    return letters >= 0.7 * len(visible)


def rst_paragraphs(text: str) -> list[str]:
    """The prose paragraphs of one reST file, each as one line of plain text, in order."""
    lines = text.expandtabs(8).splitlines()
    paragraphs: list[str] = []
    current: list[str] = []  # lines of the paragraph being read
    state = {"body": 0, "item": False}  # body indent of the paragraph; is it a list item
    i, n = 0, len(lines)

    def flush():
        joined = " ".join(current)
        if current and not _LITERAL.fullmatch(joined):  # a paragraph that is one literal is code
            paragraphs.append(inline_text(joined))
        current.clear()

    def skip_block(start: int, base: int) -> int:
        """Index of the first line at or after ``start`` that is non-blank with indent <= base."""
        j = start
        while j < n and (not lines[j].strip() or _indent(lines[j]) > base):
            j += 1
        # Give back trailing blank lines (harmless either way).
        return j

    def skip_header(start: int) -> int:
        """Skip directive argument continuation and option lines, up to the first blank line."""
        j = start
        while j < n and lines[j].strip():
            j += 1
        return j

    while i < n:
        line = lines[i]
        stripped = line.strip()
        indent = _indent(line)
        if not stripped:
            flush()
            i += 1
            continue

        # Section adornment (underline/overline) or transition: drop it, and a one-line title.
        if _ADORNMENT.match(stripped) and not _SIMPLE_TABLE_BORDER.match(stripped):
            overline = (not current and i + 2 < n and lines[i + 1].strip()
                        and _ADORNMENT.match(lines[i + 2].strip()))
            if len(current) == 1:
                current.clear()
            flush()
            i += 3 if overline else 1  # overline, title, underline
            continue

        # Tables: grid (+---+) and simple (=== ===) tables are dropped whole.
        if not current and _GRID_TABLE_BORDER.match(stripped):
            flush()
            while i < n and lines[i].strip():
                i += 1
            continue
        if not current and _SIMPLE_TABLE_BORDER.match(stripped):
            j = i + 1
            while j < n:
                if _SIMPLE_TABLE_BORDER.match(lines[j].strip()) and (j + 1 >= n or not lines[j + 1].strip()):
                    break
                j += 1
            i = j + 1
            continue

        # Explicit markup: directives, comments, targets, footnotes, substitution definitions.
        if stripped.startswith("..") and (stripped == ".." or stripped.startswith(".. ")):
            flush()
            directive = _DIRECTIVE.match(stripped)
            name = directive.group(1).split(":")[-1].lower() if directive else None
            argument = (directive.group(2) or "").strip() if directive else ""
            if name in _ADMONITIONS or name in _VERSIONED:
                if name in _VERSIONED:
                    argument = re.sub(r"^(?:[0-9][\w.]*\s*){1,2}", "", argument)
                    argument = re.sub(r"^next\b\s*", "", argument)
                current[:] = [argument] if argument else []
                state.update(body=indent + 3, item=True)
                i += 1
                while i < n and _FIELD.match(lines[i].strip()) and _indent(lines[i]) > indent:
                    i += 1
            elif name in _DESCRIPTIONS:
                i = skip_header(i + 1)
            else:  # other directives, comments, targets, footnotes, |substitution| definitions
                i = skip_block(i + 1, indent)
            continue

        if stripped.startswith("__ ") or stripped == "__":  # anonymous hyperlink target
            flush()
            i = skip_block(i + 1, indent)
            continue

        # Field lists (:Author: x, :param y: z) are dropped with their indented continuation.
        if not current and _FIELD.match(stripped):
            i = skip_block(i + 1, indent)
            continue

        # Doctest blocks and option lists.
        if not current and (stripped.startswith(">>>") or _OPTION.match(stripped)):
            while i < n and lines[i].strip():
                i += 1
            continue

        if current and indent > state["body"] and len(current) == 1 and not state["item"]:
            current.clear()  # a definition-list term; its definition follows
            state.update(body=indent, item=False)

        # List items start a new paragraph without their marker.
        marker = _BULLET.match(stripped) or _ENUMERATOR.match(stripped)
        if marker and (not current or indent <= state["body"] or state["item"]):
            flush()
            stripped = stripped[marker.end():]
            state.update(body=indent + marker.end(), item=True)
            if not stripped:
                i += 1
                continue
        elif stripped.startswith("| ") or stripped == "|":  # line block
            flush()
            stripped = stripped[1:].strip()
            state.update(body=indent, item=False)
        elif not current:
            state.update(body=indent, item=False)

        if stripped:
            current.append(stripped)
        i += 1

        # Literal block: a paragraph ending in "::" is followed by indented (or quoted) code.
        if stripped.endswith("::") and (i >= n or not lines[i].strip()):
            last = current.pop()
            last = last[:-2].rstrip() if last == "::" or last.endswith(" ::") else last[:-1]
            if last:
                current.append(last)
            flush()
            j = i
            while j < n and not lines[j].strip():
                j += 1
            if j < n and _indent(lines[j]) > state["body"]:
                i = skip_block(j, state["body"])
            elif j < n and re.match(r"[!-/:-@\[-`{-~]", lines[j].strip()):  # quoted literal block
                while j < n and lines[j].strip():
                    j += 1
                i = j
    flush()
    return [p for p in paragraphs if p]


def rst_documents(
    text: str, split: Callable[[str], Iterable[str]] | None = None, min_words: int = 3,
) -> list[list[str]]:
    """One document per reST file (sections are not split out: most files are a few kilobytes),
    as a list of sentences. ``split`` turns a paragraph into sentences (:func:`rst_corpus` passes
    :func:`jaxlm.corpora.text.split_sentences`; without it each paragraph is one line). Sentences
    under ``min_words`` words, mostly punctuation/code, or with markup residue are dropped."""
    sentences = [
        s for p in rst_paragraphs(text) for s in (split(p) if split else [p])
        if is_prose(s, min_words)
    ]
    return [sentences] if sentences else []


def rst_corpus(files: Iterable[pathlib.Path], min_sentences: int = 3) -> str:
    """BERT text of reST files (``.gz`` ones decompressed): one document per file, as
    :func:`rst_documents` cleans it, without documents under ``min_sentences``."""
    documents = []
    for file in files:
        raw = file.read_bytes()
        if file.name.endswith(".gz"):
            raw = zlib.decompress(raw, 47)
        documents += [d for d in rst_documents(raw.decode("utf-8", "replace"), split_sentences)
                      if len(d) >= min_sentences]
    return format_documents(documents)
