"""Imported once by the fork server on Linux (see :func:`engine.convert.quantize.child_context`): loads the
llama.cpp bindings there, so every child forked from the server starts with them loaded instead of
loading them itself (40-60 ms a child here).

Loading the libraries and llama.cpp's CPU variant (:mod:`engine.cpu_backend`) starts no thread:
no OpenMP threads, no GPU context; the children call ``llama_backend_init`` themselves. A failure
here is ignored: the children then load the bindings themselves and report any error in their own
words.
"""

from __future__ import annotations

import contextlib

from engine.convert.child_entry import import_native_bindings

with contextlib.suppress(Exception):
    import_native_bindings()
