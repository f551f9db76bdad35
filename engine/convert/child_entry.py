"""Entry points that run inside child processes: they must start fast.

A child imports the module of every function it is handed. This module's imports are the standard
library only, so a child that quantizes (or runs any other native job) starts with no Glassbox or
third-party import beyond the bindings it asks for: about 0.1 s less per child than importing
:mod:`engine.convert.quantize` and its GGUF reader and library. On POSIX the children are forked from
multiprocessing's fork server, which has this module imported already (see
:func:`engine.convert.quantize.child_context`).
"""

from __future__ import annotations

import os
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import multiprocessing.connection
    from collections.abc import Callable


def child_main(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    log_conn: multiprocessing.connection.Connection,
    result_conn: multiprocessing.connection.Connection,
    env: dict[str, str],
    cwd: str,
) -> None:
    """Entry point of every child: take the parent's environment and folder, route fds 1 and 2
    into the log pipe, run, send the result.

    A child forked from the fork server starts with the server's environment and folder, which
    are the parent's as they were when the server started; ``env`` and ``cwd`` are the parent's now.
    """
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fd = log_conn.fileno()
    if sys.platform == "win32":  # pragma: no cover - the pipe end is a handle there
        # lazy: Windows only
        import msvcrt

        fd = msvcrt.open_osfhandle(fd, os.O_WRONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        value = target(*args)
    except SystemExit as exc:  # argparse-style tools end with sys.exit()
        code = exc.code if isinstance(exc.code, int) else 1
        if code == 0:
            result_conn.send(("ok", None))
            return
        result_conn.send(("error", f"SystemExit: exit code {code}"))
        sys.stderr.flush()
        raise SystemExit(code) from None
    except BaseException as exc:  # noqa: BLE001 - the boundary: everything goes back to the parent as text
        traceback.print_exc()  # into the log pipe, for the log tail
        result_conn.send(("error", " ".join(f"{type(exc).__name__}: {exc}".split())))
        sys.stderr.flush()
        raise SystemExit(1) from None
    result_conn.send(("ok", value))
    sys.stdout.flush()
    sys.stderr.flush()


def import_native_bindings() -> Any:
    """Child side: ``llama_cpp.llama_cpp`` (the ctypes bindings) without the high-level package.

    ``import llama_cpp`` also imports the ``Llama`` class, chat formats and Jinja, which costs a
    second of CPU per child on a slow machine; the bindings alone are what the children use. The
    package's ``__init__`` is skipped by registering a bare package module first; if that fails
    (an unusual installer layout), the normal import is used. llama.cpp's CPU backend is loaded
    first (:func:`engine.cpu_backend.load_backends`).
    """
    # lazy: child process (+2 ms)
    import importlib
    import importlib.util

    # lazy: child process (+34 ms)
    from engine.cpu_backend import load_backends

    # The portable build's CPU code is a library chosen at run time: load it before any model.
    load_backends()
    if "llama_cpp" not in sys.modules:
        try:
            spec = importlib.util.find_spec("llama_cpp")
            if spec is not None and spec.submodule_search_locations is not None:
                package = types.ModuleType("llama_cpp")
                package.__path__ = list(spec.submodule_search_locations)
                package.__spec__ = spec
                package.__file__ = spec.origin
                sys.modules["llama_cpp"] = package
                return importlib.import_module("llama_cpp.llama_cpp")
        except Exception:  # noqa: BLE001 - any failure: fall back to the ordinary import
            for name in [n for n in sys.modules if n == "llama_cpp" or n.startswith("llama_cpp.")]:
                del sys.modules[name]
    return importlib.import_module("llama_cpp.llama_cpp")


def quantize_child(src: str, dst: str, ftype: int, allow_requantize: bool, nthread: int) -> int:
    """Child side: one ``llama_model_quantize`` call, logging straight to fd 2."""
    # lazy: child process (+5 ms)
    import ctypes

    native = import_native_bindings()

    @native.llama_log_callback  # type: ignore[untyped-decorator]
    def log_to_fd2(_level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        os.write(2, text)

    native.llama_log_set(log_to_fd2, ctypes.c_void_p(0))
    native.llama_backend_init()
    params = native.llama_model_quantize_default_params()
    params.nthread = nthread
    params.ftype = ftype
    params.allow_requantize = allow_requantize
    rc = int(native.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))
    if rc != 0:
        raise SystemExit(3)
    return rc
