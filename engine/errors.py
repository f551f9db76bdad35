"""Typed errors raised by the engine.

Every error the engine raises for bad input or a failed operation is an ``EngineError``; its
``str()`` is one line that names the file (where there is one) and the reason, fit to print after
``glassbox: error:``.
"""

from __future__ import annotations

from pathlib import Path


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ModelFileError(EngineError):
    """A model file cannot be used: missing, not GGUF, malformed, truncated.

    Args:
        path: the file.
        reason: one line saying what is wrong (and the remedy, where there is one).
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class ModelLoadError(EngineError):
    """llama.cpp refused to load a model that passed the header checks."""


class EngineCrashed(EngineError):
    """The inference worker process died (native crash, abort, out-of-memory kill).

    Args:
        exitcode: the worker's exit code; negative for a signal (``-9`` is SIGKILL).
        during: what the worker was doing.
        cause: what llama.cpp said last, or the diagnosis of a CPU fault.
        backend: the CPU backend the worker ran (``engine.cpu_backend.BackendInfo``), when known.
        cpu_fault: SIGILL/SIGSEGV/SIGBUS on load or before the first token: wrong CPU code is the
            first suspect, and the session retries once with the safe variant.
        will_repeat: sending again would crash the same way (the safe variant crashed too).
    """

    def __init__(
        self,
        exitcode: int | None,
        during: str,
        cause: str | None = None,
        *,
        backend: object | None = None,
        cpu_fault: bool = False,
        will_repeat: bool = False,
    ) -> None:
        self.exitcode = exitcode
        self.during = during
        self.cause = cause
        self.backend = backend
        self.cpu_fault = cpu_fault
        self.will_repeat = will_repeat
        if exitcode is not None and exitcode < 0:
            # lazy: start-up (+2 ms)
            import signal

            try:
                how = f"killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"killed by signal {-exitcode}"
        else:
            how = f"exit code {exitcode}"
        said = f": {cause}" if cause else ""
        super().__init__(f"the inference worker crashed during {during} ({how}){said}; the conversation is safe")


class ContextOverflow(EngineError):
    """The conversation does not fit the context window and the policy says refuse.

    Args:
        message: one line saying what does not fit.
        n_ctx: the context window, in tokens, when known.
        prompt_tokens: the tokens of what had to fit (the prompt, or the part named), when counted.
        reserve: the tokens kept for the reply beside them.
    """

    def __init__(
        self, message: str, *, n_ctx: int | None = None, prompt_tokens: int | None = None, reserve: int = 0
    ) -> None:
        super().__init__(message)
        self.n_ctx = n_ctx
        self.prompt_tokens = prompt_tokens
        self.reserve = reserve


class TemplateError(EngineError):
    """A chat template failed to render or was rejected as unsafe."""


class Cancelled(EngineError):
    """The operation was cancelled by the user."""


class DownloadError(EngineError):
    """A download failed; the message says why and what to do."""


class QuantizeError(EngineError):
    """Quantization or conversion failed."""


class HistoryError(EngineError):
    """The chat history database cannot be used: not SQLite, corrupt, unreadable, disk full.

    Args:
        path: the database file.
        reason: one line saying what is wrong (and the remedy, where there is one).
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")
