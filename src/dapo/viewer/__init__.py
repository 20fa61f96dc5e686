"""See a run: ``dapo view`` (terminal rollout browser, needs the ``viewer`` extra: textual) and
``dapo report`` (HTML report with sampling-distribution heatmaps, needs the ``report`` extra:
matplotlib). Importing this package imports neither."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``view`` and ``report`` to the ``dapo`` command."""
    from dapo.viewer import browser, report

    browser.register(subparsers)
    report.register(subparsers)
