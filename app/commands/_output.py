"""Shared output helpers for subcommands: JSON on stdout, progress on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(document: Any) -> None:
    """Prints one JSON document on stdout."""
    json.dump(document, sys.stdout, ensure_ascii=False, indent=None, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


def add_json_flag(parser: Any) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
