"""JSON files read from disk: one that is not JSON, or not UTF-8, is named with the place where it breaks."""
from __future__ import annotations

import json
import pathlib


def read_json(path) -> object:
    """The parsed contents of the file at `path`; a ValueError names its line and column where it is not JSON."""
    path = pathlib.Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}:{err.colno}: not JSON ({err.msg})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 (byte {err.start}: {err.reason})") from None
