#!/usr/bin/env python3
"""A config and overrides read as `jaxlm train` will read them, on the machine that launches the job: a mistyped key
or value is one line here, before any worker starts, not an error on every worker after its install (or, on a
cluster, after the queue). The launchers run it; by hand:

    python launch/check_config.py LAUNCHER CONFIG [section.key=value ...]

It prints `LAUNCHER: error: ...` and exits 2 for a config jaxlm refuses, and exits 0 having checked it or, where
this python cannot import jaxlm, having said that the workers will.
"""
from __future__ import annotations

import sys


def problem(config, overrides: list[str], shown: str | None = None) -> str | None:
    """What jaxlm finds wrong with `config` (named `shown` in the message) and `overrides`, or None; an ImportError
    where jaxlm is not installed."""
    from jaxlm import config as config_lib
    try:
        config_lib.load(config, overrides)
    except (config_lib.ConfigError, OSError, ValueError) as err:
        return f"{shown or config} with {' '.join(overrides) or 'no overrides'}: {err}"
    return None


def unchecked_note(launcher: str, config) -> str:
    return (f"{launcher}: note: this python cannot import jaxlm, so {config} and its overrides are checked only as "
            "jaxlm starts on the workers (run the launcher from the checkout installed with `make install` to check "
            "them here)")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: check_config.py LAUNCHER CONFIG [section.key=value ...]", file=sys.stderr)
        return 2
    launcher, config, *overrides = argv
    try:
        said = problem(config, overrides)
    except ImportError:
        print(unchecked_note(launcher, config), file=sys.stderr)
        return 0
    if said is not None:
        print(f"{launcher}: error: {said}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
