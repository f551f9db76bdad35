"""Shared helpers for subcommands: JSON on stdout, and argument types."""

from __future__ import annotations

import argparse
import json
import sys


def print_json(document: object) -> None:
    """Prints one JSON document on stdout."""
    json.dump(document, sys.stdout, ensure_ascii=False, indent=None, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero, with a one-line message otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value
