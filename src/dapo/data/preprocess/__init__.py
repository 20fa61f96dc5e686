"""``dapo preprocess <format> --input FILE --output DIR``: turn a data file the user has into
verl-schema parquet (docs/verl_compat.md, Data).

Formats: ``gsm8k``, ``math`` (MATH / MATH-lighteval), ``dapo-math-17k``, ``aime2024`` and
``generic`` (jsonl / json / csv / parquet with column options). Every format reads any of
those file types; the output is ``DIR/<split>.parquet`` with the columns ``data_source``,
``prompt`` (chat list), ``ability``, ``reward_model`` ({style, ground_truth}) and
``extra_info`` ({split, index, ...}), plus the instructions verl's preprocessors add to
the prompt so the matching scorer can grade the answer.

The CLI owner calls :func:`register` with an argparse subparsers object.
"""

from __future__ import annotations

import argparse

from dapo.data.preprocess import tool_formats  # noqa: F401,E402  (registers the tool variants)
from dapo.data.preprocess.formats import FORMATS, PreprocessError, preprocess_file

__all__ = ["FORMATS", "PreprocessError", "preprocess_file", "register", "run"]


def run(args: argparse.Namespace) -> int:
    """Entry point for ``dapo preprocess``; returns the exit status."""
    out_path, n, skipped = preprocess_file(
        args.format,
        args.input,
        args.output,
        split=args.split,
        limit=args.limit,
        skip_invalid=args.skip_invalid,
        options=vars(args),
    )
    note = f" ({skipped} invalid rows skipped)" if skipped else ""
    print(f"wrote {n} rows to {out_path}{note}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``preprocess <format>`` to a CLI's subparsers."""
    parser = subparsers.add_parser(
        "preprocess",
        help="convert a data file to verl-format parquet",
        description=__doc__.split("\n\n")[0],
    )
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True)
    for name, spec in FORMATS.items():
        sub = formats.add_parser(name, help=spec.help, description=spec.help)
        sub.add_argument("--input", "-i", required=True, help="input file (.jsonl, .json, .csv or .parquet)")
        sub.add_argument(
            "--output", "-o", required=True, help="output directory; writes <split>.parquet there"
        )
        sub.add_argument(
            "--split", default="train", help="split name stored in extra_info and used as file name"
        )
        sub.add_argument("--limit", type=int, default=None, help="keep only the first N rows")
        sub.add_argument(
            "--skip-invalid",
            action="store_true",
            help="drop rows without a usable question or answer instead of failing",
        )
        for flag, kwargs in spec.extra_args:
            sub.add_argument(flag, **kwargs)
        sub.set_defaults(func=run, format=name)
    return parser
