"""``glassbox models ...``: the model library, Hugging Face, quantization and conversion.

The group is split by concept: ``models_library`` (list, info, fit, remove), ``models_hub``
(search, files, download) and ``models_quant`` (quantize, convert).
"""

from __future__ import annotations

import argparse

from app.cli.commands import models_hub, models_library, models_quant


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser("models", parents=[common], help="find, download, inspect and quantize models")
    group = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True, parser_class=type(parser))
    for module in (models_library, models_hub, models_quant):
        module.register(group, common)
