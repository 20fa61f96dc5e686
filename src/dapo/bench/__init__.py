"""``dapo bench rollout`` and ``dapo bench update``: our engine / packed actor vs the plain path."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def run_standalone(
    name: str, register: Callable[[Any], argparse.ArgumentParser], argv: list[str] | None
) -> int:
    """Run one ``dapo bench NAME`` subcommand as its own script (``argv``: its arguments)."""
    parser = argparse.ArgumentParser(prog="dapo bench")
    register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args([name, *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
