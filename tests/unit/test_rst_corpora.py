"""reStructuredText cleaning (jaxlm.corpora.rst) and the kernel/Python documentation corpora (real fetch;
uses the default cache, the first run downloads two Debian packages)."""
import re
import textwrap

import pytest

from jaxlm.corpora.download import cache_dir
from jaxlm.corpora.registry import CORPORA
from jaxlm.corpora.rst import inline_text, rst_documents
from jaxlm.corpora.text import split_sentences


def clean(text: str) -> list[str]:
    """Sentences of one reST snippet (one document per file)."""
    docs = rst_documents(textwrap.dedent(text), split_sentences)
    assert len(docs) <= 1
    return docs[0] if docs else []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("``x = 1`` and ``__init__`` stay", "x = 1 and __init__ stay"),
        (":func:`os.path.join` and :meth:`~dict.items` and :class:`!Foo`", "os.path.join and items and Foo"),
        (":ref:`the guide <howto-logging>` and :ref:`submitting-patches`", "the guide and submitting patches"),
        (":doc:`/admin-guide/reporting-issues` or :c:func:`kmalloc`", "reporting issues or kmalloc"),
        (":pep:`8`, :rfc:`7159` and :abbr:`LIFO (last-in, first-out)`", "PEP 8, RFC 7159 and LIFO"),
        ("(Contributed by Somebody in :issue:`9998` and :gh:`95057`.)", "(Contributed by Somebody in bpo-9998 and gh-95057.)"),
        ("*emph* and **strong** but 2 * 3 * 4 and *\\*args*", "emph and strong but 2 * 3 * 4 and *args"),
        ("`JSON <https://json.org>`_ and `text`__ and `Python`_ and PEP8_", "JSON and text and Python and PEP8"),
        ("Pixelview Rev. 4_ and see-also_ but mangle_from_ and __init__ stay", "Pixelview Rev. 4 and see-also but mangle_from_ and __init__ stay"),
        ("a footnote [#]_ a named one [#note]_ a number [1]_ a citation [CIT2002]_ end",
         "a footnote a named one a number a citation end"),
        ("|version| and _`inline target` and escaped \\*star\\* and a\\ b", "version and inline target and escaped *star* and ab"),
    ],
)
def test_inline_markup(text, expected):
    assert inline_text(text) == expected


def test_titles_comments_targets_and_substitutions():
    assert clean("""
        .. SPDX-License-Identifier: GPL-2.0

        ===============
        Document title
        ===============

        .. _label-here:

        Section title
        -------------

        The first paragraph is here.
        It continues on a second line.

        .. |name| replace:: a substituted text
           that continues

        ..
           A comment block that is indented
           and spans lines.

        .. this is a one-line comment, not a directive

        ----------

        The last paragraph. It has two sentences.
        """) == [
        "The first paragraph is here.",
        "It continues on a second line.",
        "The last paragraph.",
        "It has two sentences.",
    ]


def test_directives():
    assert clean("""
        .. toctree::
           :maxdepth: 2

           intro
           usage

        .. note:: Notes keep their text.
           Even on the next line.

        .. warning::

           Warnings keep their body too.

        .. code-block:: c

           int main(void) { return 0; }

        .. kernel-doc:: include/linux/slab.h
           :functions: kmalloc

        .. c:function:: void *kmalloc(size_t size, gfp_t flags)

           Allocate kernel memory of the given size.

        .. function:: dumps(obj, *, skipkeys=False)
                      dumps(obj, **kw)
           :noindex:

           Serialize the object to a JSON string.

           .. versionadded:: 3.2
              The skipkeys argument was added.

           .. versionchanged:: 3.6

              All parameters are now keyword-only.

        .. class:: Decoder(object_hook=None)

           A simple JSON decoder class.

           .. method:: decode(s)

              Return the Python representation of the string.

           .. attribute:: strict

              Whether control characters are rejected.

        .. data:: MAX_SIZE

           The largest size that is accepted.

        .. image:: picture.png
           :alt: a picture of something long

        .. seealso:: Module pickle for the other serializer.
        """) == [
        "Notes keep their text.",
        "Even on the next line.",
        "Warnings keep their body too.",
        "Allocate kernel memory of the given size.",
        "Serialize the object to a JSON string.",
        "The skipkeys argument was added.",
        "All parameters are now keyword-only.",
        "A simple JSON decoder class.",
        "Return the Python representation of the string.",
        "Whether control characters are rejected.",
        "The largest size that is accepted.",
        "Module pickle for the other serializer.",
    ]


def test_literal_and_doctest_blocks():
    assert clean("""
        Here is the example code::

            for i in range(10):
                print(i)

        Expanded form follows the paragraph here.

        ::

            $ make htmldocs

        A colon after a space ::

            code here is dropped

        Back to the normal prose text.

        >>> import json
        >>> json.dumps([1, 2])
        '[1, 2]'

        Quoted literal blocks work too::

        > quoted code line one
        > quoted code line two

        And the end of the snippet.
        """) == [
        "Here is the example code:",
        "Expanded form follows the paragraph here.",
        "A colon after a space",
        "Back to the normal prose text.",
        "Quoted literal blocks work too:",
        "And the end of the snippet.",
    ]


def test_tables_and_field_lists():
    assert clean("""
        :Author: Somebody Important <somebody@example.org>
        :Date: 1 January 2024 in the morning

        +------------+------------+
        | Header one | Header two |
        +============+============+
        | cell with words | more words here |
        +------------+------------+

        =====  =====  ======
        A      B      A or B
        =====  =====  ======
        False  False  False

        True   False  True
        =====  =====  ======

        .. list-table:: A list table with a title
           :header-rows: 1

           * - first cell of the table
             - second cell of the table

        :param size: the size of the allocation in bytes
        :returns: a pointer to the memory that was allocated

        Text after the tables is kept.
        """) == ["Text after the tables is kept."]


def test_lists_and_definitions():
    assert clean("""
        Some items follow in a list:

        - The first bullet item,
          which continues here.
        * The second bullet item is short.

        1. An enumerated item is kept.
        2) Another enumerated item is kept.
        #. An auto-numbered item is kept.

        Definition term
            The definition of the term is kept.

        By:
          - Somebody Famous <famous@example.org>

        | A line block keeps its words.

        -v, --verbose  print more output
        ab
        """) == [
        "Some items follow in a list:",
        "The first bullet item, which continues here.",
        "The second bullet item is short.",
        "An enumerated item is kept.",
        "Another enumerated item is kept.",
        "An auto-numbered item is kept.",
        "The definition of the term is kept.",
        "Somebody Famous <famous@example.org>",
        "A line block keeps its words.",
    ]


def test_short_and_code_lines_are_dropped():
    assert clean("""
        Too short.

        x = {a: b; c: d} [] () <> == != ++ -- ;;

        ``int ioctl(int fd, int cmd, void *argp)``

        This sentence is long enough to keep.
        """) == ["This sentence is long enough to keep."]
    assert rst_documents("Title\n=====\n\n.. toctree::\n\n   a\n   b\n") == []


# ---------------------------------------------------------------- real corpora

MARKUP_RESIDUE = re.compile(r"``|:[\w:+-]+:`|(?:^|\s)\.\. |::$|={4}|-{4}|\+-{3}")
# Sizes measured on linux-doc-6.12 6.12.117-1~deb12u1 and python3.11-doc 3.11.2-6+deb12u9.
SIZES = {"kernel-docs": (10e6, 20e6, 1500), "python-docs": (4e6, 9e6, 300)}


@pytest.fixture(scope="module", params=sorted(SIZES))
def corpus(request):
    return request.param, CORPORA[request.param].fetch()


def test_real_corpus(corpus):
    name, path = corpus
    assert path == cache_dir() / "corpora" / f"{name}.txt"
    low, high, min_docs = SIZES[name]
    assert low < path.stat().st_size < high
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and not text.startswith("\n") and "\n\n\n" not in text
    docs = text.strip("\n").split("\n\n")
    assert len(docs) > min_docs
    for line in text.split("\n"):
        assert line == line.strip()
        assert not MARKUP_RESIDUE.search(line), (name, line)
        assert not line or len(line.split()) >= 3, (name, line)
    mtime = path.stat().st_mtime_ns
    assert CORPORA[name].fetch() == path and path.stat().st_mtime_ns == mtime  # cached: not rebuilt
