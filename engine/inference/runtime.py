"""The inference runtime: llama-cpp-python in a spawned child process.

llama.cpp is native code: a hostile GGUF, a ``GGML_ABORT`` or an out-of-memory kill takes the
process down with it. So the model lives in a child process (``multiprocessing`` spawn context,
one per loaded model) and the parent talks to it over a pipe. When the child dies, the parent
raises :class:`~engine.errors.EngineCrashed` with the exit signal, and the next request can start a
fresh worker.

Contract: ARCHITECTURE.md, 'engine.inference.runtime'.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.cpu_backend import AMX_TAGS, BackendInfo, BackendPolicy, describe_crash, is_cpu_fault, load_backends
from engine.errors import Cancelled, EngineCrashed, EngineError, ModelLoadError
from engine.inference.adapters import AdapterSlots, LoraAdapter, adapters_label
from engine.inference.base_compare import (
    TOP_ALTERNATIVES,
    BaseComparison,
    ComparedToken,
    first_divergence,
    first_logprob,
    score_token,
)
from engine.inference.decode_threads import DecodeThreads, candidates
from engine.inference.decoding import StopMatcher as _StopMatcher
from engine.inference.decoding import decode, prefill
from engine.inference.events import PrefillProgress, Token
from engine.inference.kv_cache import KvRequest, SeqCachePersistence
from engine.inference.projector import MediaInfo, Projector, ProjectorInfo, is_placeholder
from engine.inference.seq_memory import Checkpoint, SeqMemory
from engine.inference.speculative import DraftModel
from engine.media import Media, MediaError

_POLL_S = 0.02
_LOAD_TIMEOUT_S = 600.0

# --------------------------------------------------------------------------- the worker's CPU settings
#
# Measured on a 2-core Zen 5 KVM guest (the starter model; tests/bench/bench_threads.py keeps
# measuring it): llama.cpp's OpenMP build meets at an OpenMP barrier after every node of the graph
# (``ggml_barrier`` is ``#pragma omp barrier``), hundreds per token, so libgomp's wait decides how
# fast they pass. OMP_WAIT_POLICY=PASSIVE sleeps in the kernel at each: 2-thread decoding ran at
# 28 tok/s against 55 spinning. ACTIVE spins forever, also between replies: the idle worker burned
# 0.96 of a core. libgomp's default spins 300,000 times before it sleeps: as fast as ACTIVE alone,
# but beside other busy programs a thread spins on its core while the partner it waits for has
# none: prefill fell to 30 tok/s where one thread made 92. GOMP_SPINCOUNT=10000 (about a quarter of
# a millisecond here) was the fastest of them at 544 tok/s near quiet and kept 92 under a load of
# 11 on 2 cores. How many threads decode fastest differs by machine: on a 2-core Xeon one thread
# decoded at 69.5 tok/s and two at 46-56 (every node waits for the slower thread, and the window,
# the pipe and any other program take a core from one of them), on a 2-core Zen 5 two made 75
# where one made 63. So the worker times the candidates in its first replies and keeps the
# fastest (``engine.inference.decode_threads``). Prompt batches are compute bound: all physical cores,
# as llama.cpp's own default (``cpu_get_num_math``), less those other programs are running on when
# the prompt is read (``prompt_threads``). GOMP_SPINCOUNT is libgomp's (Linux builds);
# other OpenMP runtimes keep their own defaults, and many-core machines were not measured.
WORKER_ENVIRONMENT: dict[str, str] = {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "10000"}
"""The environment the worker sets for llama.cpp's OpenMP before loading it (a value the user's
environment already has is kept); an empty value is not set."""


def usable_cores() -> int:
    """Physical cores this process may run on (its CPU affinity, then SMT siblings left out)."""
    logical = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        logical = len(os.sched_getaffinity(0)) or logical
    try:
        # lazy: optional dependency (psutil)
        import psutil

        physical = psutil.cpu_count(logical=False) or logical
        total = psutil.cpu_count(logical=True) or logical
    except ImportError:
        physical = total = logical
    # An affinity of fewer CPUs than the machine has: scale the physical cores down alike.
    return max(1, min(physical, round(physical * logical / max(total, 1))))


def default_threads(cores: int | None = None) -> tuple[int, int]:
    """``(decode threads, prefill threads)`` when the settings leave them to Glassbox: every
    physical core for both; these are the most a reply uses (see above: the worker times fewer
    decode threads and prompt batches take the cores nobody else uses)."""
    cores = max(1, cores if cores is not None else usable_cores())
    return cores, cores


BUSY_SAMPLES = 5  # readings of others_running, the median kept
BUSY_GAP_S = 0.0002  # between them: about a millisecond in all


def others_running(samples: int = BUSY_SAMPLES, gap_s: float = BUSY_GAP_S) -> int | None:
    """Threads of other programs running on the CPUs now (Linux: ``/proc/stat``'s
    ``procs_running``, less this process's own running threads: the one reading it, and any other
    of the worker's, such as the KV cache's writer or an OpenMP thread still spinning), or None
    where it cannot be told. The median of ``samples`` readings ``gap_s`` apart: a thread that runs
    for a moment (the app that just sent the prompt, a kernel worker) is not a busy program."""
    readings = []
    for i in range(max(1, samples)):
        if i:
            time.sleep(gap_s)
        reading = _others_now()
        if reading is None:
            return None
        readings.append(reading)
    return sorted(readings)[len(readings) // 2]


def _others_now() -> int | None:
    try:
        with open("/proc/stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"procs_running "):
                    return max(0, int(line.split()[1]) - max(1, _own_running()))
    except (OSError, ValueError):
        return None
    return None


def _own_running() -> int:
    """This process's threads in the running state now (``/proc/self/task/*/stat``; 1 where unreadable)."""
    running = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue  # the thread ended meanwhile
        running += bool(fields) and fields[0] == b"R"
    return running


def prompt_threads(cores: int, busy: int | None) -> int:
    """Threads for a prompt batch on ``cores`` cores with ``busy`` other threads running: the cores
    nobody else is using (at least one). A thread that has to share its core holds up every
    barrier of the others: beside one busy program on 2 cores, 2 prefill threads made 310 tok/s
    where one made 448 (alone: 728 against 450)."""
    return max(1, cores - (busy or 0))


def apply_worker_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """Sets :data:`WORKER_ENVIRONMENT` in ``env`` (default ``os.environ``) where it is not set
    already; returns what the environment now holds for those names. Must run before llama.cpp's
    libraries are loaded in the process (libgomp reads it once)."""
    target: Any = os.environ if env is None else env
    for name, value in WORKER_ENVIRONMENT.items():
        if value and name not in target:
            target[name] = value
    return {name: target[name] for name in WORKER_ENVIRONMENT if name in target}


class LoadParams(BaseModel):
    """How to load a model. Picklable: it crosses to the worker process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: Path
    n_ctx: int = Field(default=4096, ge=16)
    # CPU threads for decoding and for prompt batches; None: default_threads(). n_threads alone
    # sets both.
    n_threads: int | None = Field(default=None, ge=1)
    n_threads_batch: int | None = Field(default=None, ge=1)
    n_batch: int = Field(default=512, ge=1)
    n_gpu_layers: int = Field(default=0, ge=-1)
    seed: int = 0xFFFFFFFF
    swa_full: bool | None = None
    # Which of llama.cpp's CPU variants the worker runs (engine.cpu_backend): a tag forces one;
    # None chooses the best this CPU runs, except the avoided tags and, unless allowed, AMX.
    cpu_variant: str | None = None
    cpu_avoid: tuple[str, ...] = ()
    allow_amx: bool = False
    # A smaller model of the same vocabulary, loaded in the same worker to draft tokens for
    # speculative decoding (GenerationParams.speculative="draft"); refused when the vocabularies differ.
    draft_model_path: Path | None = None
    # The model's multimodal projector (engine.inference.projector): images and/or audio in prompts.
    mmproj_path: Path | None = None

    def backend_policy(self) -> BackendPolicy:
        return BackendPolicy(variant=self.cpu_variant, avoid=self.cpu_avoid, allow_amx=self.allow_amx)

    def threads(self, cores: int | None = None) -> tuple[int, int]:
        """``(decode, prefill)`` threads: as given, else :func:`default_threads`."""
        decode, batch = default_threads(cores)
        if self.n_threads is not None:
            decode = batch = self.n_threads
        return decode, self.n_threads_batch or batch


class GenerationParams(BaseModel):
    """Sampling settings for one reply. ``temperature=0`` is greedy (deterministic)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=512, ge=1)
    temperature: float = Field(default=0.7, ge=0.0)
    top_k: int = Field(default=40, ge=0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    min_p: float = Field(default=0.05, ge=0.0, le=1.0)
    repeat_penalty: float = Field(default=1.0, gt=0.0)
    # OpenAI's penalties (llama.cpp's penalties sampler, over the last tokens of the context):
    # subtract frequency_penalty per earlier occurrence of a token, presence_penalty once if it occurred.
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    # Locally typical sampling (1.0: off), and Mirostat (1 or 2: llama.cpp's samplers in place of
    # top-k / typical / top-p / min-p, after the temperature; tau the target surprise, eta its rate).
    typical_p: float = Field(default=1.0, gt=0.0, le=1.0)
    mirostat: Literal[0, 1, 2] = 0
    mirostat_tau: float = Field(default=5.0, gt=0.0, le=100.0)
    mirostat_eta: float = Field(default=0.1, gt=0.0, le=1.0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Constrained output: GBNF text (root rule ``root``) or a JSON schema as JSON text, which the
    # worker turns into a grammar (llama_cpp.LlamaGrammar.from_json_schema). At most one of them.
    grammar: str | None = None
    json_schema: str | None = None
    # (token id, bias) pairs added to the logits before sampling; -inf bans a token.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # > 0: each Token carries its log-probability and this many most likely alternatives.
    logprobs: int = Field(default=0, ge=0, le=20)
    # Speculative decoding (engine.inference.speculative): "lookup" drafts from n-grams of the prompt and the
    # reply, "draft" from LoadParams.draft_model_path. Verified by the target model: the output is
    # what decoding without it would give (up to llama.cpp's batch-shape arithmetic at near ties).
    speculative: Literal["off", "lookup", "draft"] = "off"
    draft_max: int = Field(default=12, ge=1, le=64)

    @model_validator(mode="after")
    def _one_constraint(self) -> GenerationParams:
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("grammar and json_schema cannot both be given")
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except ValueError as exc:
                raise ValueError(f"json_schema is not valid JSON ({exc})") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("json_schema must be a JSON object")
        for token_id, _bias in self.logit_bias:
            if token_id < 0:
                raise ValueError(f"logit_bias: token id {token_id} is negative")
        return self


@dataclass(frozen=True)
class ModelInfo:
    """What the worker reports once the model is loaded."""

    path: str
    architecture: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_params: int
    model_bytes: int
    n_layers: int
    n_gpu_layers: int
    gpu_offload_supported: bool
    bos_token: str | None
    eos_token: str | None
    add_bos: bool
    chat_template: str | None
    metadata: dict[str, str] = field(default_factory=dict)
    cpu_backend: BackendInfo | None = None  # the CPU code llama.cpp runs on (set by the parent)
    n_threads: int = 0  # the CPU threads decoding runs on
    n_threads_batch: int = 0  # ... and prompt batches
    environment: dict[str, str] = field(default_factory=dict)  # the OpenMP settings it runs with
    # The model's sequence memory (engine.inference.seq_memory): "kv" (a transformer's cache, cut
    # at any token), "recurrent" (Mamba, RWKV: one state, restored from copies) or "hybrid".
    memory: str = "kv"
    kind: Literal["local"] = "local"  # RemoteInfo's is "remote": a LoadedModel's info says which it is
    projector: ProjectorInfo | None = None  # what the loaded mmproj reads (None: no projector)


@dataclass(frozen=True)
class WorkerResult:
    """Counters and timings of one generation, measured inside the worker."""

    reason: str  # "stop" | "length" | "cancelled"
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    n_past: int
    ttft_ms: float
    prefill_ms: float
    decode_ms: float
    draft_tokens: int = 0  # tokens proposed by speculative decoding
    accepted_tokens: int = 0  # of those, the ones the model verified and kept
    kv_restored_tokens: int = 0  # of cached_tokens, the ones loaded from a saved KV cache (engine.inference.kv_cache)
    kv_restore_ms: float = 0.0
    kv_saved_bytes: int = 0  # the KV state queued for saving after this turn
    stop_sequence: str | None = None  # the stop string (of GenerationParams.stop) that ended the reply, if one did
    draft_restores: int = 0  # rejected drafts taken back by restoring a copy of a recurrent state
    speculation_note: str = ""  # why speculation was off although it was asked for ("" when it was not)
    encode_ms: float = 0.0  # the projector's encoding of images and clips (not in prefill_ms)
    media_encoded: int = 0  # image and audio chunks encoded
    media_tokens: int = 0  # of prompt_tokens, the placeholders of images and clips
    adapters: str = ""  # the LoRA adapters the reply ran with (engine.inference.adapters), "" for none
    recomputed_tokens: int = 0  # prompt tokens read again because a change of adapters emptied the cache
    recompute_ms: float = 0.0  # what reading them again cost (their share of the prefill)
    decode_threads: int = 0  # the threads its last single-token step ran on (engine.inference.decode_threads)
    prompt_threads: int = 0  # the threads its prompt was read on (prompt_threads)


@dataclass(frozen=True)
class _WorkerError:
    kind: str
    message: str


# --------------------------------------------------------------------------- the child side


class _Worker:
    """Runs in the child process: owns the ``Llama`` object."""

    def __init__(self, params: LoadParams, log_path: str | None = None) -> None:
        # lazy: heavy (llama_cpp)
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.params = params
        self.n_threads, self.n_threads_batch = params.threads()
        # Unless the settings fix them, prompt batches take the cores no other program is using
        # at the moment a prompt is read (prompt_threads); the split of the work among threads
        # does not change the arithmetic, so replies do not depend on it.
        self._adapt_batch_threads = params.n_threads is None and params.n_threads_batch is None
        self._batch_threads_now = self.n_threads_batch
        self._decode_threads_now = self.n_threads
        # Unless the settings fix them, the decode threads are timed in the first replies and the
        # fastest kept (engine.inference.decode_threads: which is fastest differs by machine).
        self.decode_threads = DecodeThreads(
            self._set_decode_threads,
            candidates(self.n_threads) if params.n_threads is None else [self.n_threads],
        )
        # Typed as Any: llama-cpp-python's internals are partly untyped, and we use a few of them.
        self.llm: Any = llama_cpp.Llama(
            model_path=str(params.model_path),
            n_ctx=params.n_ctx,
            n_batch=params.n_batch,
            n_ubatch=params.n_batch,
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads_batch,
            n_gpu_layers=params.n_gpu_layers,
            seed=params.seed,
            swa_full=params.swa_full,
            verbose=False,
        )
        self.draft: Any = None  # engine.inference.speculative.DraftModel
        if params.draft_model_path is not None:
            self.draft = DraftModel(
                llama_cpp, params.draft_model_path, self.llm, self.n_ctx, self.n_threads, params.n_gpu_layers
            )
        self.memory = SeqMemory(llama_cpp, self.llm)
        self.projector: Projector | None = None
        if params.mmproj_path is not None:
            self.projector = Projector(
                self.llm,
                params.mmproj_path,
                self.n_threads_batch,  # encoding an image is a batch's work
                params.n_batch,
                use_gpu=params.n_gpu_layers != 0 and bool(llama_cpp.llama_supports_gpu_offload()),
            )
        self.adapters = AdapterSlots(llama_cpp, self.llm, lambda: _last_words(Path(log_path) if log_path else None))
        # A memory that cannot be cut (recurrent) keeps a copy of its state at the end of the last
        # prompt: the next turn's prompt starts with it, whatever the reply re-tokenizes to.
        self.prompt_checkpoint: Checkpoint | None = None

    @property
    def n_ctx(self) -> int:
        """The usable context window.

        WORKAROUND: llama.cpp rounds the context up to a multiple of 256, but llama-cpp-python
        0.3.36 sizes its token buffer to the requested length: going past it raises deep inside
        ``Llama.eval``. The smaller of the two is what can really be used.
        """
        return int(min(self.llm.n_ctx(), len(self.llm.input_ids)))

    def info(self) -> ModelInfo:
        llm = self.llm
        meta = dict(llm.metadata)
        arch = meta.get("general.architecture", "unknown")
        vocab = llm._model.vocab
        bos_id = llm.token_bos()
        eos_id = llm.token_eos()

        def piece(token_id: int) -> str | None:
            if token_id < 0:
                return None
            return str(llm._model.token_get_text(token_id))

        return ModelInfo(
            path=str(self.params.model_path),
            architecture=arch,
            n_ctx=self.n_ctx,
            n_ctx_train=llm._model.n_ctx_train(),
            n_vocab=llm.n_vocab(),
            n_params=int(llm._model.n_params()),
            model_bytes=int(llm._model.size()),
            n_layers=int(meta.get(f"{arch}.block_count", "0") or 0),
            n_gpu_layers=self.params.n_gpu_layers,
            gpu_offload_supported=bool(self._llama_cpp.llama_supports_gpu_offload()),
            bos_token=piece(bos_id),
            eos_token=piece(eos_id),
            add_bos=bool(self._llama_cpp.llama_vocab_get_add_bos(vocab)),
            chat_template=meta.get("tokenizer.chat_template"),
            metadata={k: v for k, v in meta.items() if len(v) <= 4096},
            memory=self.memory.kind,
            projector=self.projector.info() if self.projector is not None else None,
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads_batch,
            environment={name: os.environ[name] for name in WORKER_ENVIRONMENT if name in os.environ},
        )

    def piece(self, token: int, special: bool) -> bytes:
        """The bytes of one token.

        WORKAROUND: ``LlamaModel.token_to_piece`` in llama-cpp-python 0.3.36 returns its whole
        32-byte buffer, NUL padding included; use the length llama.cpp returns instead.
        """

        lc = self._llama_cpp
        vocab = self.llm._model.vocab
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_token_to_piece(vocab, token, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        return ["" if is_placeholder(t) else self.piece(t, True).decode("utf-8", errors="replace") for t in tokens]

    # images and clips (engine.inference.projector) ---------------------------------------------
    def add_media(self, items: Sequence[Media]) -> list[MediaInfo | str]:
        """Reads each item into the projector; an item it refuses gets its one-line reason."""
        out: list[MediaInfo | str] = []
        for media in items:
            if self.projector is None:
                out.append(f"{media.name or media.digest[:12]}: this model has no projector (mmproj)")
                continue
            if os.environ.get("GLASSBOX_TEST_CRASH_ON_MEDIA") == media.digest:
                os.abort()  # lets tests prove that a decoder crashing on an image is survived
            try:
                out.append(self.projector.add(media))
            except MediaError as exc:
                out.append(str(exc))
        return out

    def tokenize_parts(self, parts: Sequence[str | tuple[str, str]], add_bos: bool) -> list[int] | list[str]:
        """A prompt split at its media: text parts tokenized (special tokens parsed), each
        ``("media", digest)`` part replaced by its expansion. When the projector no longer holds
        some media, their digests are returned instead (the parent sends them again)."""
        tokens: list[int] = []
        missing: list[str] = []
        first = True
        for part in parts:
            if isinstance(part, str):
                if part or (first and add_bos):
                    tokens += list(self.llm.tokenize(part.encode("utf-8"), add_bos=first and add_bos, special=True))
            else:
                expansion = self.projector.expansion(part[1]) if self.projector is not None else None
                if expansion is None:
                    missing.append(part[1])
                else:
                    if first and add_bos:
                        tokens += list(self.llm.tokenize(b"", add_bos=True, special=True))
                    tokens += expansion
            first = False
        return missing if missing else tokens

    # the KV cache saved with each chat (engine.inference.kv_cache) -------------------------------
    _kv: SeqCachePersistence | None = None

    def kv_configure(self, request: KvRequest | None) -> None:
        """Sets (or, with None, turns off) the saved cache for the turns that follow."""
        if self._kv is None:
            self._kv = SeqCachePersistence(self.params.model_path, self.n_ctx, self.params.mmproj_path)
            self._kv.adapters = _adapters_identity(self.adapters.active)
        self._kv.configure(request)

    def kv_restore(self, tokens: Sequence[int]) -> None:
        """Before the prefix reuse: loads the saved state that covers more of ``tokens`` than RAM."""
        if self._kv is not None:
            self._kv.restore(self.llm, tokens, in_ram=self._reusable(tokens), trimmable=self.memory.trimmable)

    def kv_result(self, result: WorkerResult) -> WorkerResult:
        """The result with this turn's restore and save figures."""
        if self._kv is None:
            return result
        return dataclasses.replace(
            result, **self._kv.result_fields(self.llm, result.cached_tokens, self._saved_checkpoint())
        )

    def kv_save(self) -> None:
        """After the result was sent: copies the state and writes it in the background."""
        if self._kv is not None:
            self._kv.save(self.llm, self._saved_checkpoint())

    def _saved_checkpoint(self) -> Checkpoint | None:
        """What a memory that cannot be cut saves: its state at the end of the prompt (a later
        turn's prompt starts there), not after the reply, whose tokens the next prompt may spell
        differently. None: the state as it is (a KV cache is cut to any prefix when loaded)."""
        checkpoint = self.prompt_checkpoint
        if self.memory.trimmable or checkpoint is None or not checkpoint.full:
            return None
        if not self.memory.usable(checkpoint, int(self.llm.n_tokens)):
            return None  # not a prefix of what the memory holds
        return checkpoint

    def set_adapters(self, adapters: Sequence[LoraAdapter]) -> bool:
        """Runs the turns that follow with ``adapters`` (engine.inference.adapters); a change
        empties the KV cache in RAM, and a saved one is only restored for the same adapters."""
        changed = self.adapters.apply(adapters)
        if changed:
            self.prompt_checkpoint = None
            if self._kv is not None:
                self._kv.adapters = _adapters_identity(self.adapters.active)
        return changed

    def kv_park(self, request: KvRequest) -> int:
        """Before the worker stops: saves the sequence the context holds under ``request``'s key
        (a model pool's, for a prompt no chat's saved cache holds), so the model's next load
        restores it instead of prefilling it again. Returns the bytes queued (written before the
        worker exits)."""
        if int(self.llm.n_tokens) == 0:
            return 0
        self.kv_configure(request)
        assert self._kv is not None
        checkpoint = self._saved_checkpoint()
        self._kv.result_fields(self.llm, 0, checkpoint)
        self._kv.save(self.llm, checkpoint)
        return self._kv.saved_bytes

    def kv_close(self) -> None:
        """Finishes the queued write (before the worker exits)."""
        if self._kv is not None:
            self._kv.close()

    def _common_prefix(self, tokens: Sequence[int]) -> int:
        """The longest common prefix with the last sequence, short of the last token (at least
        one token must be evaluated to get fresh logits for sampling)."""
        llm = self.llm
        cached = llm._input_ids[: llm.n_tokens]
        prefix = 0
        for a, b in zip(cached, tokens, strict=False):
            if a != b:
                break
            prefix += 1
        prefix = min(prefix, len(tokens) - 1)
        # Never inside an image's placeholders: an image is read whole (only a hash collision of
        # two images' first placeholders could stop a match there).
        while prefix > 0 and is_placeholder(tokens[prefix]) and is_placeholder(tokens[prefix - 1]):
            if self.projector is not None and self.projector.chunk_at(tokens, prefix) is not None:
                break
            prefix -= 1
        return prefix

    def _reusable(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` the memory in RAM can keep without evaluating."""
        prefix = self._common_prefix(tokens)
        if self.memory.trimmable or prefix >= self.llm.n_tokens:
            return prefix
        checkpoint = self.prompt_checkpoint
        if checkpoint is not None and self.memory.usable(checkpoint, prefix):
            return checkpoint.n_tokens
        return 0

    def _fit_threads(self) -> None:
        """Before a prompt is read: as many batch threads as there are cores nobody else uses,
        and the decode threads measured fastest at this level of other programs' use."""
        busy = others_running()
        self.decode_threads.begin_reply(busy)
        if not self._adapt_batch_threads:
            return
        wanted = min(self.n_threads_batch, prompt_threads(self.n_threads_batch, busy))
        if wanted != self._batch_threads_now:
            self._llama_cpp.llama_set_n_threads(self.llm._ctx.ctx, self._decode_threads_now, wanted)
            self._batch_threads_now = wanted

    def _set_decode_threads(self, n_threads: int) -> None:
        if n_threads != self._decode_threads_now:
            self._llama_cpp.llama_set_n_threads(self.llm._ctx.ctx, n_threads, self._batch_threads_now)
            self._decode_threads_now = n_threads

    def _reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Keeps the KV cache for the longest common prefix with the last sequence; returns its length.

        Where the memory cannot be cut there (a recurrent state), the copy at the last prompt's end
        is restored when the new prompt starts with it; otherwise the memory is cleared."""
        llm = self.llm
        prefix = self._common_prefix(tokens)
        if prefix < llm.n_tokens:
            prefix = self.memory.rewind(prefix, self.prompt_checkpoint)
        llm.n_tokens = max(prefix, 0)
        checkpoint = self.prompt_checkpoint
        if checkpoint is not None and checkpoint.n_tokens > llm.n_tokens:
            self.prompt_checkpoint = None  # it no longer describes a prefix of this sequence
        return int(llm.n_tokens)

    def _checkpoint_prompt(self) -> None:
        """Partway through a prompt, on a memory that cannot be cut: a copy of its state (the whole
        state when the KV cache on disk may save it, else the recurrent part). Taken where the
        conversation so far ends (or before the prompt's last token), the next turn's prompt and
        the same prompt again (a regenerated reply) start from it, whatever the reply re-tokenizes
        to and whatever the template does to the reply's header."""
        full = self._kv is not None and self._kv.request is not None
        self.prompt_checkpoint = self.memory.checkpoint(full=full, keep_tokens=True)

    def generate(
        self,
        tokens: Sequence[int],
        params: GenerationParams,
        cancel: Any,
        send: Any,
        checkpoint_at: int | None = None,
        resume: int = 0,
    ) -> WorkerResult:
        """One generation: the prefix reuse, the prefill, the decode loop.

        ``checkpoint_at``: where the conversation so far ends in ``tokens`` (before the reply's
        header), which the next turn's prompt starts with; a memory that cannot be cut keeps a copy
        of its state there (else before the prompt's last token).
        """
        llm = self.llm
        t0 = time.perf_counter()
        self.kv_restore(tokens)
        if not tokens:
            raise EngineError("empty prompt")
        n_ctx = self.n_ctx
        if len(tokens) >= n_ctx:
            raise EngineError(f"prompt of {len(tokens)} tokens does not fit the context window of {n_ctx}")
        if params.speculative == "draft" and self.draft is None:
            raise EngineError("speculative decoding with a draft model: no draft model was loaded with this model")
        media_tokens = sum(1 for token in tokens if is_placeholder(token))
        text_prompt: Sequence[int] = tokens
        note = ""
        if media_tokens:
            self._check_media_prompt(tokens)
            text_prompt = [token for token in tokens if not is_placeholder(token)]
            if params.speculative == "draft":
                params = params.model_copy(update={"speculative": "lookup"})
                note = (
                    "the draft model is off for a prompt with images or audio (it cannot read them): "
                    "prompt lookup instead"
                )
        projector = self.projector
        if projector is not None:
            projector.reset_counters()
        cached = self._reuse_prefix(tokens)
        # A memory that cannot be cut copies its state where the next prompt will start from it
        # (see _checkpoint_prompt); a KV cache reads the prompt in whole chunks.
        pause = None
        if not self.memory.trimmable:
            at = checkpoint_at if checkpoint_at is not None and cached <= checkpoint_at < len(tokens) else None
            at = at if at is not None else len(tokens) - 1
            pause = (at - cached, self._checkpoint_prompt) if at >= cached else None
        new = list(tokens[cached:])
        read_media = projector if media_tokens else None
        self._fit_threads()
        if not prefill(llm, self._llama_cpp, new, self.params.n_batch, cancel, send, self.memory, pause, read_media):
            encode_ms = projector.encode_ms if projector is not None else 0.0
            return WorkerResult(
                "cancelled",
                "",
                len(tokens),
                cached,
                0,
                llm.n_tokens,
                0.0,
                (time.perf_counter() - t0) * 1000 - encode_ms,
                0.0,
                encode_ms=encode_ms,
                media_encoded=projector.encoded if projector is not None else 0,
                media_tokens=media_tokens,
            )
        t_prefill = time.perf_counter()
        encode_ms = projector.encode_ms if projector is not None else 0.0
        out = decode(
            llm,
            self._llama_cpp,
            lambda token: self.piece(token, special=False),
            params,
            text_prompt,
            n_ctx,
            self.params.n_batch,
            _StopMatcher(params.stop),
            cancel,
            send,
            self.draft,
            offloaded=self.params.n_gpu_layers != 0 and bool(self._llama_cpp.llama_supports_gpu_offload()),
            memory=self.memory,
            resume=resume,
            threads=self.decode_threads,
        )
        t_end = time.perf_counter()
        t_first = out.t_first
        recompute = self.adapters.recompute(tokens, len(tokens) - cached, (t_prefill - t0) * 1000 - encode_ms)
        return WorkerResult(
            reason=out.reason,
            text=out.text,
            prompt_tokens=len(tokens),
            cached_tokens=cached,
            completion_tokens=out.completion_tokens,
            n_past=llm.n_tokens,
            ttft_ms=(t_first - t0) * 1000,
            prefill_ms=(t_prefill - t0) * 1000 - encode_ms,
            decode_ms=(t_end - t_first) * 1000,
            draft_tokens=out.draft_tokens,
            accepted_tokens=out.accepted_tokens,
            stop_sequence=out.stop_sequence,
            draft_restores=out.draft_restores,
            speculation_note=out.speculation_note or note,
            encode_ms=encode_ms,
            media_encoded=projector.encoded if projector is not None else 0,
            media_tokens=media_tokens,
            adapters=adapters_label(self.adapters.active),
            recomputed_tokens=recompute.tokens,
            recompute_ms=recompute.ms,
            decode_threads=self._decode_threads_now,
            prompt_threads=self._batch_threads_now,
        )

    def compare_base(
        self, tokens: Sequence[int], params: GenerationParams, adapters: Sequence[LoraAdapter], cancel: Any, send: Any
    ) -> BaseComparison | None:
        """The prompt ``tokens`` decoded greedily with ``adapters``, then with none
        (engine.inference.base_compare); None when Stop came first.

        Both runs read the whole prompt from an empty memory, in the same batches: llama.cpp's
        arithmetic depends on the batch shape (a prompt's last token read alone or in its batch
        gives logits apart by more than a near tie on a quantized model), so only the adapters
        differ between them. Then the adapters the context had are set again and its KV cache put
        back as it was (a full copy of the state taken before), so the next turn starts where it
        would have: nothing of the runs is kept, nothing is saved to disk, and the next turn's
        stats count no recompute.
        """
        llm = self.llm
        if not tokens:
            raise EngineError("empty prompt")
        if len(tokens) >= self.n_ctx:
            raise EngineError(f"prompt of {len(tokens)} tokens does not fit the context window of {self.n_ctx}")
        run = params.model_copy(
            update={
                "temperature": 0.0,
                "speculative": "off",
                "logprobs": max(params.logprobs, TOP_ALTERNATIVES),
                "seed": None,
            }
        )
        slots = self.adapters
        before, invalidated, prompt_checkpoint = slots.active, slots.invalidated, self.prompt_checkpoint
        held = [int(t) for t in llm.input_ids[: llm.n_tokens]]
        saved = self.memory.checkpoint(full=True, keep_tokens=True) if held else None
        outcome: BaseComparison | None = None
        try:
            self.set_adapters(adapters)
            label = adapters_label(self.adapters.active)
            adapted = self._greedy_run(tokens, run, cancel, send)
            if adapted is None:
                return None
            self.set_adapters([])
            a_ids = [t.token_id for t in adapted[0]]
            base = self._greedy_run(tokens, run, cancel, send, probe=a_ids[0] if a_ids else None)
            if base is None:
                return None
            b_ids = [t.token_id for t in base[0]]
            d = first_divergence(a_ids, b_ids)
            known = len(a_ids) if d is None else min(d + 1, len(a_ids))
            base_logprobs: list[float | None] = [base[0][i].logprob if i < len(b_ids) else None for i in range(known)]
            if d is not None and d < len(a_ids):
                # The base's probability of the adapter's token where they part (they agree on
                # everything before it): at the first token, read from the prefill's logits; later,
                # one evaluation of the base's own sequence there, its token read alone as decoding did.
                sequence = [*tokens, *b_ids]
                at = len(tokens) + d
                base_logprobs[d] = (
                    base[3] if d == 0 else score_token(llm, self._llama_cpp, self.memory, sequence, at, a_ids[d], run)
                )
            outcome = BaseComparison(
                adapters=label,
                adapted=adapted[0],
                base=base[0],
                adapted_reason=adapted[1],
                base_reason=base[1],
                divergence=d,
                base_logprobs=tuple(base_logprobs),
                prompt_tokens=len(tokens),
                adapted_ms=adapted[2],
                base_ms=base[2],
            )
        finally:
            t0 = time.perf_counter()
            self.set_adapters(before)
            restored = self.memory.put_back(saved) if saved is not None else False
            if not restored:
                llm._ctx.kv_cache_clear()
                llm.n_tokens = 0
            self.prompt_checkpoint = prompt_checkpoint if restored else None
            # The next turn's stats say what the comparison cost it, only when the cache was lost.
            slots.invalidated = invalidated if restored or not held else held
            restore_ms = (time.perf_counter() - t0) * 1000
        assert outcome is not None
        return dataclasses.replace(outcome, restore_ms=restore_ms, restored=restored or not held)

    def _greedy_run(
        self, tokens: Sequence[int], params: GenerationParams, cancel: Any, send: Any, probe: int | None = None
    ) -> tuple[tuple[ComparedToken, ...], str, float, float | None] | None:
        """One run of :meth:`compare_base`: the whole prompt read from an empty memory, then the
        greedy decode, its tokens kept here (with their log-probabilities), its finish reason, what
        it took, and the log-probability of ``probe`` as the first token (None: not asked); None
        when Stop came first."""
        llm = self.llm
        t0 = time.perf_counter()
        media_tokens = sum(1 for token in tokens if is_placeholder(token))
        if media_tokens:
            self._check_media_prompt(tokens)
        llm._ctx.kv_cache_clear()
        llm.n_tokens = 0
        self.prompt_checkpoint = None
        self._fit_threads()
        read_media = self.projector if media_tokens else None
        whole = list(tokens)
        if not prefill(llm, self._llama_cpp, whole, self.params.n_batch, cancel, send, self.memory, None, read_media):
            return None
        probed = first_logprob(llm, self._llama_cpp, probe, params) if probe is not None else None
        events: list[object] = []
        out = decode(
            llm,
            self._llama_cpp,
            lambda token: self.piece(token, special=False),
            params,
            [token for token in tokens if not is_placeholder(token)],
            self.n_ctx,
            self.params.n_batch,
            _StopMatcher(params.stop),
            cancel,
            events.append,
            None,
            offloaded=self.params.n_gpu_layers != 0 and bool(self._llama_cpp.llama_supports_gpu_offload()),
            memory=self.memory,
        )
        if out.reason == "cancelled":
            return None
        chosen = [e for e in events if isinstance(e, Token) and e.token_id >= 0]
        texts = self.pieces([t.token_id for t in chosen])
        compared = tuple(
            ComparedToken(t.token_id, text, t.logprob if t.logprob is not None else 0.0, t.top_logprobs)
            for t, text in zip(chosen, texts, strict=True)
        )
        return compared, out.reason, (time.perf_counter() - t0) * 1000, probed

    def _check_media_prompt(self, tokens: Sequence[int]) -> None:
        """A prompt with placeholders: the worker must be able to read it (or it says why not)."""
        if self.projector is None:
            raise EngineError("the prompt holds images or audio, but this model was loaded without a projector")
        if not self.memory.trimmable:
            raise EngineError(
                f"images and audio are not supported on a model with {self.memory.kind} memory yet "
                "(its state cannot be taken back to before an image)"
            )
        if is_placeholder(tokens[-1]):
            raise EngineError("the prompt ends with an image: the model needs text after it to answer")


def _adapters_identity(adapters: Sequence[LoraAdapter]) -> str:
    """What the adapters add to a saved KV cache's identity: a state computed with other adapters
    (or other scales) is never restored. "" for the base model (the identity of older files)."""
    if not adapters:
        return ""
    parts = []
    for adapter in adapters:
        try:
            stat = adapter.path.stat()
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:
            size = mtime = 0
        parts.append(f"{adapter.path}:{size}:{mtime}:{adapter.scale!r}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


def _worker_main(
    conn: multiprocessing.connection.Connection, cancel: Any, params: LoadParams, log_path: str | None
) -> None:
    """Entry point of the worker process.

    llama.cpp writes its log, and its last words before an abort, to file descriptor 2: that goes
    to ``log_path`` so the terminal stays clean and the parent can quote the cause of a crash.
    """
    if log_path is not None:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
    apply_worker_environment()  # before llama.cpp (and with it libgomp) is loaded
    backend = load_backends(params.backend_policy())
    conn.send(("backend", backend))
    if backend.error is not None:
        conn.send(("error", _WorkerError("load", f"{params.model_path}: {backend.error}")))
        return
    if os.environ.get("GLASSBOX_TEST_CRASH_ON_LOAD"):
        os.abort()  # lets tests prove that a native abort during load is survived
    _test_cpu_fault("load", backend)
    try:
        worker = _Worker(params, log_path)
        conn.send(("loaded", worker.info()))
    except ModelLoadError as exc:  # the draft model's refusal says which file and why
        conn.send(("error", _WorkerError("load", str(exc))))
        return
    except Exception as exc:  # noqa: BLE001 - everything must reach the parent as a typed error
        conn.send(("error", _WorkerError("load", f"{params.model_path}: llama.cpp could not load it ({exc})")))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        op = message[0]
        try:
            if op == "close":
                worker.kv_close()  # the queued KV-cache write is finished first: nothing is lost
                # Then leave at once: freeing the model and the interpreter's teardown took ~0.6 s
                # of the app's exit, and the kernel frees that memory anyway.
                sys.stderr.flush()
                os._exit(0)
            if op == "tokenize":
                conn.send(("result", worker.tokenize(message[1], message[2], message[3])))
            elif op == "pieces":
                conn.send(("result", worker.pieces(message[1])))
            elif op == "bytes":
                conn.send(("result", [worker.piece(token, special=True) for token in message[1]]))
            elif op == "media":
                conn.send(("result", worker.add_media(message[1])))
            elif op == "tokenize_parts":
                conn.send(("result", worker.tokenize_parts(message[1], message[2])))
            elif op == "reset":
                worker.llm._ctx.kv_cache_clear()
                worker.llm.n_tokens = 0
                worker.prompt_checkpoint = None
                conn.send(("result", None))
            elif op == "generate":
                _test_cpu_fault("generate", backend)
                checkpoint_at = message[3] if len(message) > 3 else None
                resume = message[4] if len(message) > 4 else 0
                send = _test_fault_after_tokens(backend, lambda event: conn.send(("event", event)))
                result = worker.generate(message[1], message[2], cancel, send, checkpoint_at, resume)
                conn.send(("result", worker.kv_result(result)))
                worker.kv_save()  # after the result: the reply never waits for the disk
            elif op == "kv":
                worker.kv_configure(message[1])
                conn.send(("result", None))
            elif op == "park":
                conn.send(("result", worker.kv_park(message[1])))
            elif op == "adapters":
                conn.send(("result", worker.set_adapters(message[1])))
            elif op == "compare":
                progress = _test_fault_after_tokens(backend, lambda event: conn.send(("event", event)))
                conn.send(("result", worker.compare_base(message[1], message[2], message[3], cancel, progress)))
            else:
                conn.send(("error", _WorkerError("protocol", f"unknown request {op!r}")))
        except EngineError as exc:
            conn.send(("error", _WorkerError("engine", str(exc))))
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", _WorkerError("engine", f"{type(exc).__name__}: {exc}")))


def _test_fault_after_tokens(backend: BackendInfo, send: Any) -> Any:
    """Lets tests prove that a SIGILL in the middle of a reply is survived:
    ``GLASSBOX_TEST_SIGILL=token:N`` kills the worker after it sent N tokens (the probe passed, the
    AMX code died later), unless it runs ``GLASSBOX_TEST_SIGILL_SPARE``."""
    fault = os.environ.get("GLASSBOX_TEST_SIGILL", "")
    if not fault.startswith("token:") or backend.variant == os.environ.get("GLASSBOX_TEST_SIGILL_SPARE"):
        return send
    after = int(fault.partition(":")[2])
    sent = 0

    def counting(event: object) -> None:
        nonlocal sent
        send(event)
        if isinstance(event, Token):
            sent += 1
            if sent >= after:
                os.kill(os.getpid(), signal.SIGILL)
                time.sleep(5)  # the signal is delivered at once; never reached

    return counting


def _test_cpu_fault(when: str, backend: BackendInfo) -> None:
    """Lets tests prove that wrong CPU code is diagnosed: ``GLASSBOX_TEST_SIGILL=load|generate``
    kills the worker with SIGILL there, unless it runs ``GLASSBOX_TEST_SIGILL_SPARE`` (a variant
    tag: the one a retry falls back to)."""
    if os.environ.get("GLASSBOX_TEST_SIGILL") != when:
        return
    if backend.variant is not None and backend.variant == os.environ.get("GLASSBOX_TEST_SIGILL_SPARE"):
        return
    os.kill(os.getpid(), signal.SIGILL)
    time.sleep(5)  # the signal is delivered at once; never reached


# --------------------------------------------------------------------------- the parent side


class InferenceWorker:
    """Parent-side handle of one worker process with one loaded model.

    One owner at a time: the methods are not meant to be called concurrently (the session
    serialises requests with a lock).
    """

    def __init__(self, params: LoadParams, log_path: Path | None = None) -> None:
        self.params = params
        self.log_path = log_path
        self._ctx = multiprocessing.get_context("spawn")
        self._cancel = self._ctx.Event()
        self._conn: multiprocessing.connection.Connection | None = None
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._own_log = False
        self.info: ModelInfo | None = None
        self.backend: BackendInfo | None = None
        self._tokens_out = 0  # tokens this worker produced: a crash before the first is a CPU suspect

    # lifetime ---------------------------------------------------------------------------
    def start(self, cancel: threading.Event | None = None) -> ModelInfo:
        """Spawns the worker and loads the model. Raises ModelLoadError or EngineCrashed."""
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="glassbox-worker-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._own_log = True
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self._cancel, self.params, str(self.log_path)),
            name="glassbox-inference",
            daemon=True,
        )
        proc.start()
        child.close()
        self._conn, self._proc = parent, proc
        deadline = time.monotonic() + _LOAD_TIMEOUT_S
        while True:
            if cancel is not None and cancel.is_set():
                self.close(kill=True)
                raise Cancelled("model load cancelled")
            if self._poll(_POLL_S):
                kind, payload = self._recv("model load")
                if kind != "backend":
                    break
                self.backend = payload
                continue
            if time.monotonic() > deadline:
                self.close(kill=True)
                raise ModelLoadError(f"{self.params.model_path}: loading took longer than {_LOAD_TIMEOUT_S:.0f} s")
        if kind == "error":
            self.close(kill=True)
            raise ModelLoadError(payload.message)
        assert isinstance(payload, ModelInfo)
        self.info = dataclasses.replace(payload, cpu_backend=self.backend)
        return self.info

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self, kill: bool = False, timeout: float = 5.0) -> None:
        """Ends the worker: politely (close request) unless ``kill``; always reaps it."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
            return
        if not kill and proc.is_alive() and conn is not None:
            try:
                conn.send(("close",))
            except (OSError, BrokenPipeError):
                pass
            proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout)
        if conn is not None:
            conn.close()
        if self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None
            self._own_log = False

    def __enter__(self) -> InferenceWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # requests ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        return self._call(("tokenize", text, add_bos, special), "tokenization")  # type: ignore[no-any-return]

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        return self._call(("pieces", list(tokens)), "detokenization")  # type: ignore[no-any-return]

    def token_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        """Each token's bytes, special tokens as their text."""
        return self._call(("bytes", list(tokens)), "detokenization")  # type: ignore[no-any-return]

    def add_media(self, items: Sequence[Media]) -> list[MediaInfo | str]:
        """Hands images and clips to the worker's projector: each one's info, or why it was refused.
        A decoder that crashes takes the worker down (EngineCrashed), never this process."""
        return self._call(("media", list(items)), "reading an image")  # type: ignore[no-any-return]

    def tokenize_parts(self, parts: Sequence[str | tuple[str, str]], add_bos: bool) -> list[int] | list[str]:
        """A prompt's tokens, its media expanded (see ``_Worker.tokenize_parts``); the digests the
        worker no longer holds, when some are missing."""
        return self._call(("tokenize_parts", list(parts), add_bos), "tokenization")  # type: ignore[no-any-return]

    def reset_cache(self) -> None:
        self._call(("reset",), "cache reset")

    def configure_kv_cache(self, request: KvRequest | None) -> None:
        """Saves and restores the turns that follow under ``request``'s key (None: neither)."""
        self._call(("kv", request), "KV cache setup")

    def park_kv_cache(self, request: KvRequest) -> int:
        """Saves the sequence the worker holds under ``request``'s key (before it is stopped);
        the bytes queued, written before the worker exits."""
        return int(self._call(("park", request), "saving the KV cache"))

    def set_adapters(self, adapters: Sequence[LoraAdapter]) -> bool:
        """Runs the turns that follow with these LoRA adapters (empty: the base model), without
        reloading the model. Returns whether what the model computes changed (its KV cache was
        then emptied). Raises EngineError naming the file that does not fit."""
        return bool(self._call(("adapters", list(adapters)), "applying adapters"))

    def compare_base(
        self,
        tokens: Sequence[int],
        params: GenerationParams,
        adapters: Sequence[LoraAdapter],
        cancel: threading.Event | None = None,
    ) -> Generator[PrefillProgress, None, BaseComparison | None]:
        """Decodes ``tokens`` greedily with ``adapters`` and without them, then puts the worker's
        adapters and KV cache back as they were (engine.inference.base_compare). Streams each run's
        prefill progress; the generator's return value is the comparison, None when ``cancel``
        stopped it."""
        during = "comparing with the base model"
        self._cancel.clear()
        self._send(("compare", list(tokens), params, list(adapters)), during)
        forwarded = False
        finished = False
        try:
            while True:
                if cancel is not None and cancel.is_set() and not forwarded:
                    self._cancel.set()
                    forwarded = True
                if not self._poll(_POLL_S):
                    continue
                kind, payload = self._recv(during)
                if kind == "event":
                    yield payload
                elif kind == "result":
                    finished = True
                    return payload  # type: ignore[no-any-return]
                else:
                    finished = True
                    raise EngineError(payload.message)
        except EngineCrashed:
            finished = True
            raise
        finally:
            if not finished:
                self._abandon()

    def generate(
        self,
        tokens: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
        checkpoint_at: int | None = None,
        resume: int = 0,
    ) -> Generator[PrefillProgress | Token, None, WorkerResult]:
        """Streams events; the generator's return value is the :class:`WorkerResult`.

        ``checkpoint_at``: where the conversation so far ends in ``tokens`` (a recurrent model
        keeps a copy of its state there for the next turn; see ``ModelInfo.memory``).
        ``resume``: the last ``resume`` of ``tokens`` are a reply begun on another worker (whose CPU
        code crashed): the grammar and the penalties take them as generated, the reply goes on.
        """
        self._cancel.clear()
        self._send(("generate", list(tokens), params, checkpoint_at, resume), "generation")
        forwarded = False
        finished = False
        shown: list[str] = []  # the text of the tokens passed on
        dropped = False
        try:
            while True:
                if cancel is not None and cancel.is_set() and not forwarded:
                    self._cancel.set()
                    forwarded = True
                if not self._poll(_POLL_S):
                    continue
                kind, payload = self._recv("generation")
                if kind == "event":
                    if isinstance(payload, Token):
                        self._tokens_out += 1
                        if forwarded:  # sent before the worker saw Stop: nothing follows Stop
                            dropped = True
                            continue
                        shown.append(payload.text)
                    yield payload
                elif kind == "result":
                    finished = True
                    assert isinstance(payload, WorkerResult)
                    if dropped:  # the reply is what was shown
                        payload = dataclasses.replace(
                            payload, reason="cancelled", text="".join(shown), stop_sequence=None
                        )
                    return payload
                else:
                    finished = True
                    raise EngineError(payload.message)
        except EngineCrashed:
            finished = True
            raise
        finally:
            if not finished:
                self._abandon()

    def _abandon(self) -> None:
        """The consumer stopped listening mid-generation: cancel it and drain to the result."""
        if self._conn is None:
            return
        self._cancel.set()
        deadline = time.monotonic() + 10.0
        try:
            while time.monotonic() < deadline:
                if self._poll(_POLL_S) and self._recv("generation")[0] in ("result", "error"):
                    return
        except EngineCrashed:
            return
        self.close(kill=True)

    # plumbing ---------------------------------------------------------------------------
    def _send(self, message: tuple[Any, ...], during: str) -> None:
        if self._conn is None or self._proc is None:
            raise EngineCrashed(None, during) if self.info is not None else EngineError("no model is loaded")
        try:
            self._conn.send(message)
        except (OSError, BrokenPipeError):
            raise self._crashed(during) from None

    def _poll(self, timeout: float) -> bool:
        assert self._conn is not None and self._proc is not None
        try:
            if self._conn.poll(timeout):
                return True
        except (OSError, EOFError):
            raise self._crashed("a request") from None
        if not self._proc.is_alive():
            # Drain anything sent just before dying.
            try:
                if self._conn.poll(0):
                    return True
            except (OSError, EOFError):
                pass
            raise self._crashed("a request")
        return False

    def _recv(self, during: str) -> tuple[str, Any]:
        assert self._conn is not None
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            raise self._crashed(during) from None
        return message[0], message[1]

    def _call(self, message: tuple[Any, ...], during: str) -> Any:
        self._send(message, during)
        while not self._poll(_POLL_S):
            pass
        kind, payload = self._recv(during)
        if kind == "error":
            raise EngineError(payload.message)
        return payload

    def _crashed(self, during: str) -> EngineCrashed:
        proc = self._proc
        code: int | None = None
        if proc is not None:
            proc.join(2.0)
            code = proc.exitcode
        cause = _last_words(self.log_path)
        self.close(kill=True)
        amx_sigill = code == -signal.SIGILL and self.backend is not None and self.backend.variant in AMX_TAGS
        if is_cpu_fault(code) and (self._tokens_out == 0 or amx_sigill):
            # On load or before the first token the CPU code itself is the first suspect; a SIGILL
            # on the AMX variant is its known bug at any time (the tile state lost in a switch).
            return EngineCrashed(code, during, describe_crash(code, self.backend), backend=self.backend, cpu_fault=True)
        return EngineCrashed(code, during, cause)


def _last_words(log_path: Path | None) -> str | None:
    """The last error-looking line llama.cpp wrote before the worker died, if any."""
    if log_path is None:
        return None
    try:
        with log_path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            lines = log.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    markers = ("error", "assert", "abort", "failed", "out of memory")
    for line in reversed(lines):
        if any(marker in line.lower() for marker in markers):
            return line.strip()[:300]
    return None
