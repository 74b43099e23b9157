"""JSON files read from disk: one that is not JSON, or not UTF-8, is named with the place where it breaks."""
from __future__ import annotations

import json

from jaxlm.corpora.text import utf8_text


def read_json(path) -> object:
    """The parsed contents of the file at `path`; a ValueError names its line and column where it is not JSON
    (or its line where it is not UTF-8)."""
    try:
        return json.loads(utf8_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}:{err.colno}: not JSON ({err.msg})") from None
