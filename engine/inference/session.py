"""A chat session: one loaded model, its chat template, the context budget and the stats.

This is the headless heart of a chat turn (ARCHITECTURE.md, "Walk 1: a chat turn", steps
3–4): fit the conversation into the window, render the template, tokenize, stream from the worker
(reusing the KV cache for the common prefix), and measure what it cost.

``ChatSession.stream`` is a plain generator of typed events (:mod:`engine.inference.events`), ending with
``Finished``. A crashed worker raises :class:`~engine.errors.EngineCrashed`; the next call starts a
fresh worker, so the conversation (kept by the caller) carries on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.cpu_backend import AMX_TAGS, AMX_VM_NOTE, BackendInfo, BackendState, is_virtual_machine, safe_variant
from engine.errors import Cancelled, ContextOverflow, EngineCrashed, EngineError, ModelLoadError
from engine.fit import kv_cache_bytes
from engine.gguf import GgufInfo, read_gguf_info
from engine.hardware import cpu_name
from engine.inference.adapters import LoraAdapter
from engine.inference.base_compare import BaseComparison
from engine.inference.context import (
    NO_DOCUMENTS,
    ContextPlan,
    DocumentsFit,
    Message,
    OverflowPolicy,
    RankedDocuments,
    effective_reserve,
    fit_documents,
    has_media,
    plan_context,
    split_media,
    system_message,
)
from engine.inference.cpu_probe import probe_variant
from engine.inference.events import Event, Finished, PrefillProgress, Stats, Token
from engine.inference.grammar_bounds import check_constraint
from engine.inference.kv_cache import KvCacheConfig, KvKey, KvRequest
from engine.inference.projector import MediaInfo
from engine.inference.reply import special_markers
from engine.inference.runtime import (
    GenerationParams,
    InferenceWorker,
    LoadParams,
    ModelInfo,
    WorkerResult,
)
from engine.inference.templates import ChatTemplate, select_template
from engine.inference.thinking_settings import template_controls
from engine.inference.tools import ToolSpec
from engine.inference.turn import TurnShape, shape_turn
from engine.lora import check_adapter
from engine.media import Media, MediaError
from engine.mmproj import ProjectorFacts, projector_problem, read_projector


@dataclass(frozen=True)
class PromptView:
    """The last prompt as the model saw it: token ids and their text pieces (for the inspector)."""

    token_ids: list[int]
    pieces: list[str]


class ChatSession:
    """Owns one inference worker and everything needed to turn messages into replies.

    Args:
        load: how to load the model.
        machine_bandwidth_gbps: this machine's measured memory bandwidth, reported in Stats.
        overflow_policy: "rolling" evicts the oldest turns; "refuse" raises ContextOverflow.
        reply_reserve: tokens kept free for the reply.
        backend_state: the file where this machine's CPU-variant verdicts are kept (a variant that
            crashed, whether AMX works); None keeps them for this session only and never enables AMX.
        kv_cache: where the KV cache of each chat is saved on disk (engine.inference.kv_cache), for the
            turns that ``stream`` is given a ``cache_key``; None: never saved nor restored.
    """

    def __init__(
        self,
        load: LoadParams,
        *,
        machine_bandwidth_gbps: float | None = None,
        overflow_policy: OverflowPolicy = "rolling",
        reply_reserve: int = 512,
        backend_state: Path | None = None,
        kv_cache: KvCacheConfig | None = None,
    ) -> None:
        self.load_params = load
        self.kv_cache = kv_cache
        self._kv_sent: tuple[InferenceWorker, KvRequest | None] | None = None
        self.machine_bandwidth_gbps = machine_bandwidth_gbps
        self.overflow_policy: OverflowPolicy = overflow_policy
        self.reply_reserve = reply_reserve
        self.gguf: GgufInfo = read_gguf_info(load.model_path)
        # The projector's header is read (and matched to the model) before llama.cpp sees it.
        self.projector: ProjectorFacts | None = None
        if load.mmproj_path is not None:
            self.projector = read_projector(load.mmproj_path)
            problem = projector_problem(self.projector, self.gguf)
            if problem is not None:
                raise ModelLoadError(f"{load.mmproj_path}: {problem}")
        self._media: dict[str, MediaInfo] = {}  # what the current worker's projector has read
        self._media_data: dict[str, Media] = {}
        self._worker: InferenceWorker | None = None
        self.info: ModelInfo | None = None
        self.template: ChatTemplate | None = None
        self._specials: dict[int, str] | None = None  # marker tokens the worker renders without text
        self.last_prompt: list[int] = []
        self.last_plan: ContextPlan | None = None
        self._last_fit: tuple[RankedDocuments, int, DocumentsFit] | None = None
        self.offload_note: str | None = None
        self._prompt_tokens: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self.backend_state_path = backend_state
        self._backend_state: BackendState | None = None
        self.backend: BackendInfo | None = None
        self.backend_note: str | None = None
        self._cpu_note = ""  # what the CPU code did during the current reply (its Stats.cpu_note)
        self._adapters: tuple[LoraAdapter, ...] = ()
        self._adapters_sent: tuple[InferenceWorker, tuple[LoraAdapter, ...]] | None = None
        self._parked: KvRequest | None = None  # a state saved before the last unload (park)

    # lifetime -------------------------------------------------------------------------------
    def load(self, cancel: threading.Event | None = None) -> ModelInfo:
        """Starts the worker and loads the model (idempotent). Raises ModelLoadError, EngineCrashed."""
        with self._lock:
            return self._ensure_worker(cancel)

    def _ensure_worker(self, cancel: threading.Event | None = None) -> ModelInfo:
        if self._worker is not None and self._worker.alive and self.info is not None:
            return self.info
        if self._worker is not None:
            self._worker.close(kill=True)
        worker, info = self._start_with_fallback(cancel)
        self._worker, self.info = worker, info
        self._media.clear()
        self.template = select_template(info.chat_template, info.architecture, info.bos_token, info.eos_token)
        self._specials = None
        return info

    def _start_with_fallback(self, cancel: threading.Event | None) -> tuple[InferenceWorker, ModelInfo]:
        """Starts the worker; when GPU layers fail to load (out of VRAM), retries with fewer; when
        the CPU code crashes on load, retries once with the safe CPU variant.

        Halves the offloaded layers on each failure, down to CPU only, and remembers what worked
        in ``load_params`` (``offload_note`` and ``backend_note`` say what happened).
        """
        params = self._apply_backend_state(self.load_params)
        while True:
            worker = InferenceWorker(params)
            try:
                info = worker.start(cancel)
            except EngineCrashed as exc:
                if exc.cpu_fault:
                    params = self._after_cpu_fault(exc, params)
                    continue
                if params.n_gpu_layers == 0:
                    raise
                params = self._fewer_gpu_layers(params)
                continue
            except ModelLoadError:
                if params.n_gpu_layers == 0:
                    raise
                params = self._fewer_gpu_layers(params)
                continue
            worker, info, params = self._prove_amx(worker, info, params, cancel)
            self.load_params = params
            self.backend = worker.backend
            return worker, info

    def _fewer_gpu_layers(self, params: LoadParams) -> LoadParams:
        fewer = 0 if params.n_gpu_layers < 0 else params.n_gpu_layers // 2
        self.offload_note = f"loading with {params.n_gpu_layers} GPU layers failed; retrying with {fewer}"
        return params.model_copy(update={"n_gpu_layers": fewer})

    # CPU variants ---------------------------------------------------------------------------
    def _state(self) -> BackendState:
        if self._backend_state is None:
            self._backend_state = BackendState.open(self.backend_state_path, cpu_name())
        return self._backend_state

    def _apply_backend_state(self, params: LoadParams) -> LoadParams:
        """What this machine taught us (crashed variants, AMX verdict), unless a variant is forced."""
        if params.cpu_variant is not None:
            return params
        policy = self._state().policy()
        avoid = tuple(sorted({*params.cpu_avoid, *policy.avoid}))
        return params.model_copy(update={"cpu_avoid": avoid, "allow_amx": params.allow_amx or policy.allow_amx})

    def _after_cpu_fault(self, exc: EngineCrashed, params: LoadParams) -> LoadParams:
        """The worker died of SIGILL/SIGSEGV/SIGBUS on load or before its first token: the next
        load runs the safe CPU variant; when that is what crashed, sending again would too."""
        backend = exc.backend if isinstance(exc.backend, BackendInfo) else None
        safe = safe_variant(backend.available) if backend is not None else None
        if backend is None or backend.variant is None or safe is None or backend.variant == safe.tag:
            if backend is not None and backend.build == "single":
                advice = (
                    "this llama.cpp build has one CPU backend, made for another CPU: reinstall Glassbox "
                    "(or rebuild with installers/llama_build.py)"
                )
            else:
                advice = (
                    "that is llama.cpp's safest CPU variant here, so sending again would crash the same "
                    "way: reinstall Glassbox, and if it persists report it with `glassbox --self-test --json`"
                )
            raise EngineCrashed(
                exc.exitcode,
                exc.during,
                f"{exc.cause}; {advice}",
                backend=backend,
                cpu_fault=True,
                will_repeat=True,
            ) from exc
        name = signal.Signals(-(exc.exitcode or 0)).name if exc.exitcode else "a crash"
        if exc.exitcode == -signal.SIGILL:
            # Only an illegal instruction is certain to be the CPU code's fault: remember it. A
            # segfault may be the model file's, and must not demote this machine for good.
            self._state().mark_broken(backend.variant, f"{name} during {exc.during}")
        self.backend_note = (
            f"llama.cpp's {backend.variant} CPU code crashed here ({name} during {exc.during}); "
            f"running its safe {safe.tag} variant ({safe.file}) instead"
        )
        return params.model_copy(update={"cpu_variant": safe.tag})

    def _prove_amx(
        self, worker: InferenceWorker, info: ModelInfo, params: LoadParams, cancel: threading.Event | None
    ) -> tuple[InferenceWorker, ModelInfo, LoadParams]:
        """On a CPU with AMX, once per machine and build: a probe (engine.inference.cpu_probe: the
        kernel's tile permission, then three runs in fresh children with every core oversubscribed)
        decides whether llama.cpp's AMX variant runs here. Until then (and after a failed probe) the
        worker runs the best variant without AMX; a passing probe reloads on the AMX variant. On a
        virtual machine (the ``hypervisor`` flag) there is no probe unless ``GLASSBOX_AMX=probe``:
        AMX stays off. Whatever the probe said, a SIGILL on the AMX variant later turns it off for
        good (:meth:`_after_cpu_fault`, through the reply's resumption)."""
        backend = worker.backend
        state = self._state()
        if backend is None or not backend.amx_untested or state.path is None or state.amx is not None:
            return worker, info, params
        tag = next(tag for tag, _ in backend.skipped if tag in AMX_TAGS)
        if is_virtual_machine() and os.environ.get("GLASSBOX_AMX") != "probe":
            self.backend_note = AMX_VM_NOTE  # not remembered: GLASSBOX_AMX=probe later still probes
            return worker, info, params
        verdict = probe_variant(params.model_path, tag, params.n_threads, cancel)
        state.set_amx(verdict)
        if verdict != "ok":
            self.backend_note = f"llama.cpp's AMX code ({tag}) failed a probe on this machine ({verdict}); not used"
            return worker, info, params
        amx = params.model_copy(update={"allow_amx": True})
        fresh = InferenceWorker(amx)
        try:
            fresh_info = fresh.start(cancel)
        except (ModelLoadError, EngineCrashed) as exc:
            state.set_amx(f"failed after the probe: {exc}")
            return worker, info, params
        worker.close()
        self.backend_note = f"llama.cpp's AMX code ({tag}) passed a probe on this machine"
        return fresh, fresh_info, amx

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker(self) -> InferenceWorker | None:
        return self._worker

    # what the model is (engine.inference.backends.ChatBackend) ------------------------------
    @property
    def model_id(self) -> str:
        """A local file has no server name: ""."""
        return ""

    @property
    def n_ctx(self) -> int:
        """The loaded window (0 before the load)."""
        return self.info.n_ctx if self.info is not None else 0

    @property
    def n_vocab(self) -> int | None:
        return self.info.n_vocab if self.info is not None else None

    @property
    def thinking_controls(self) -> frozenset[str]:
        return template_controls(self.template) if self.template is not None else frozenset()

    @property
    def local(self) -> ChatSession:
        """The session is a local model (engine.inference.backends.LocalBackend)."""
        return self

    @property
    def worker_pid(self) -> int | None:
        worker = self._worker
        return worker.pid if worker is not None else None

    @property
    def worker_alive(self) -> bool:
        worker = self._worker
        return worker is not None and worker.alive

    def kill_worker(self, timeout: float = 1.0) -> None:
        """Ends the worker process now, without waiting for the session's lock (the last resort at
        exit, while a turn may still hold it)."""
        worker = self._worker
        if worker is not None:
            worker.close(kill=True, timeout=timeout)

    # tokens ---------------------------------------------------------------------------------
    def count_text(self, text: str) -> int:
        assert self._worker is not None
        return len(self._worker.tokenize(text, add_bos=False, special=False)) if text else 0

    def _tokenize_prompt(self, prompt: str) -> list[int]:
        """Tokens of a rendered prompt; the last few are remembered, since planning the context
        renders and counts the very prompt that is then sent (one pipe round trip saved a turn).
        A prompt with media markers is tokenized in parts, each image or clip replaced by the
        projector's tokens for it (placeholders: engine/inference/projector.py)."""
        cached = self._prompt_tokens.get(prompt)
        if cached is not None:
            return cached
        assert self._worker is not None and self.info is not None
        bos = self.info.bos_token
        add_bos = self.info.add_bos and not (bos and prompt.startswith(bos))
        if has_media(prompt):
            tokens = self._tokenize_media_prompt(prompt, add_bos)
        else:
            tokens = self._worker.tokenize(prompt, add_bos=add_bos, special=True)
        if len(self._prompt_tokens) >= 8:
            self._prompt_tokens.pop(next(iter(self._prompt_tokens)))
        self._prompt_tokens[prompt] = tokens
        return tokens

    def _tokenize_media_prompt(self, prompt: str, add_bos: bool) -> list[int]:
        assert self._worker is not None
        parts = split_media(prompt)
        for _attempt in range(2):
            result = self._worker.tokenize_parts(parts, add_bos)
            if not result or isinstance(result[0], int):
                return [int(t) for t in result]
            # The worker's projector let some go (it keeps the most recent few): send them again.
            lost = [self._media_data[str(digest)] for digest in result if str(digest) in self._media_data]
            for digest in result:
                self._media.pop(str(digest), None)
            if len(lost) != len(result):
                raise EngineError("the prompt holds an image or a clip that was never attached to this chat")
            self._read_media(lost)
        raise EngineError("the model's projector keeps dropping this prompt's images (more than it holds at once?)")

    # images and clips -----------------------------------------------------------------------
    def media_info(self, media: Sequence[Media]) -> list[MediaInfo]:
        """What each image or clip costs this model: the projector's own token count (read by the
        worker, which starts if needed). Raises MediaError (the model cannot see images, or one
        cannot be read)."""
        with self._lock:
            self._ensure_worker()
            return self._read_media(media)

    def _read_media(self, media: Sequence[Media]) -> list[MediaInfo]:
        assert self._worker is not None and self.info is not None
        if media and self.info.projector is None:
            what = "images or audio" if any(m.kind == "audio" for m in media) else "images"
            raise MediaError(
                media[0].name,
                f"this model cannot see {what}: {Path(self.load_params.model_path).name} was loaded without a "
                "projector (mmproj); download its mmproj (glassbox models download --with-mmproj), choose one "
                "(glassbox models projector MODEL FILE) or choose a vision model",
            )
        todo = [m for m in dict.fromkeys(media) if m.digest not in self._media]
        if todo:
            for item, answer in zip(todo, self._worker.add_media(todo), strict=True):
                if isinstance(answer, str):
                    raise MediaError("", answer)
                self._media[item.digest] = answer
                self._media_data[item.digest] = item
        return [self._media[m.digest] for m in media]

    def _media_tokens(self, message: Message) -> int:
        return sum(self._media[m.digest].tokens for m in message.media if m.digest in self._media)

    def _marker_tokens(self) -> dict[int, str]:
        """This vocabulary's tool and thinking markers that are one token (asked once per worker)."""
        if self._specials is None:
            self._specials = special_markers(self._tokenize_special)
        return self._specials

    def _tokenize_special(self, text: str) -> list[int]:
        """Tokens of text that goes into a prompt after generated tokens (special tokens parsed)."""
        assert self._worker is not None
        return self._worker.tokenize(text, add_bos=False, special=True)

    def count_messages(self, messages: Sequence[Message]) -> int:
        assert self.template is not None
        return len(self._tokenize_prompt(self.template.render([_as_dict(m) for m in messages])))

    def _documents_fit(self, documents: RankedDocuments | None) -> DocumentsFit:
        """The documents band over ``documents``, as ``stream`` fits them (the last fit is kept: the
        steps of one turn with tools measure the same passages)."""
        assert self.info is not None
        if documents is None:
            return NO_DOCUMENTS
        last = self._last_fit
        if last is not None and last[0] is documents and last[1] == self.info.n_ctx:
            return last[2]
        fit = fit_documents(documents, self.info.n_ctx, self.count_text)
        self._last_fit = (documents, self.info.n_ctx, fit)
        return fit

    def prompt_view(self) -> PromptView:
        """The last prompt's tokens and pieces (empty before the first turn)."""
        with self._lock:
            if self._worker is None or not self.last_prompt:
                return PromptView([], [])
            return PromptView(list(self.last_prompt), self._worker.pieces(self.last_prompt))

    # generation -----------------------------------------------------------------------------
    def stream(
        self,
        history: Sequence[Message],
        user: str | None,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        cancel: threading.Event | None = None,
        cache_key: KvKey | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
        thinking_budget: int | None = None,
        media: Sequence[Media] = (),
    ) -> Iterator[Event]:
        """Generates the reply to ``user`` after ``history``; yields events, ends with Finished.

        ``user=None`` continues the last turn of ``history`` without a new user message (after a
        ``tool`` message: engine/agent/loop.py). ``tools`` are offered under ``tool_choice`` (``auto``
        when tools are given, ``none``, ``required`` or a function name; the last two constrain the
        reply to a valid call); ``thinking`` and ``reasoning_effort`` set the template's switches,
        ``thinking_budget`` caps the thinking in tokens (engine/inference/turn.py). The reply streams as
        ``Token`` (the answer), ``Reasoning`` (thinking) and ``ToolCall`` events; ``Finished``
        carries the answer, the reasoning and the calls apart.

        With a ``cache_key`` (and a ``kv_cache`` folder), the turn starts from that conversation's
        saved KV cache when it covers more of the prompt than the worker's RAM, and its KV state is
        saved after it (in the worker, in the background).

        ``media`` are the images and clips attached to ``user`` (history messages carry their
        own): the projector reads them in the worker and their tokens are the ``media`` band of the
        budget; ``Stats.encode_ms`` is the time it took to encode them.

        Raises:
            MediaError: the model has no projector for the new message's media, or one cannot be
                read (the history's media on a model without a projector are left out, counted in
                ``Stats.media_dropped``).
            ContextOverflow: the conversation does not fit and the policy is "refuse" (or even the
                pinned parts do not fit).
            EngineCrashed: the worker died; the next call starts a fresh one.
            EngineError: the tool choice, the tools or the thinking switch are not usable here.
        """
        params = params or GenerationParams()
        with self._lock:
            self._ensure_worker()
            assert self._worker is not None and self.info is not None and self.template is not None
            turn = shape_turn(
                self.template,
                params,
                tools=tools,
                tool_choice=tool_choice,
                thinking=thinking,
                reasoning_effort=reasoning_effort,
                thinking_budget=thinking_budget,
            )
            plan, prompt, tokens, run, dropped_media = self._render_turn(
                turn, history, user, params, system, documents, media
            )
            self.last_plan = plan
            self.last_prompt = tokens
            shaper = turn.shaper(prompt, self._marker_tokens())
            checkpoint_at = self._conversation_end(turn, plan, tokens) if self.info.memory != "kv" else None
            self._prepare(cache_key)
            self._cpu_note = ""
            try:
                result = yield from turn.generate(
                    self._resuming(cache_key, checkpoint_at), tokens, run, cancel, shaper, self._tokenize_special
                )
            except EngineCrashed:
                self._worker = None
                self.last_prompt = []
                raise
            stats = self._stats(result, plan)
            stats = dataclasses.replace(
                stats,
                kv_restored_tokens=result.kv_restored_tokens,
                kv_restore_ms=result.kv_restore_ms,
                kv_saved_bytes=result.kv_saved_bytes,
                media_dropped=dropped_media,
            )
            yield stats
            reason = result.reason
            finished = shaper.finished(reason, stats)  # type: ignore[arg-type]
            yield dataclasses.replace(finished, stop_sequence=result.stop_sequence)

    def _render_turn(
        self,
        turn: TurnShape,
        history: Sequence[Message],
        user: str | None,
        params: GenerationParams,
        system: str | None,
        documents: RankedDocuments | None,
        media: Sequence[Media],
    ) -> tuple[ContextPlan, str, list[int], GenerationParams, int]:
        """A turn's prompt (under the lock, the worker started): its plan, its text, its tokens,
        the parameters it runs with (the template's stop strings added), and the history's media
        left out (a model without a projector)."""
        assert self.info is not None and self.template is not None
        check_constraint(turn.params(params))  # a grammar bomb: refused before the prompt is even read

        def count_tokens(messages: Sequence[Message]) -> int:
            return len(self._tokenize_prompt(turn.render(messages)))

        history, dropped_media = self._media_history(history)
        self._read_media([*(m for message in history for m in message.media), *media])
        plan = plan_context(
            system=system,
            documents=documents,
            history=list(history),
            user=user,
            user_media=media,
            media_tokens=self._media_tokens,
            n_ctx=self.info.n_ctx,
            reply_reserve=min(self.reply_reserve, params.max_tokens),
            count_tokens=count_tokens,
            count_text=self.count_text,
            policy=self.overflow_policy,
            tools_tokens=turn.tools_tokens(lambda text: len(self._tokenize_prompt(text))),
        )
        prompt = turn.render(plan.messages)
        tokens = self._tokenize_prompt(prompt)
        stops = tuple(dict.fromkeys((*params.stop, *self.template.stop)))
        return plan, prompt, tokens, turn.params(params.model_copy(update={"stop": stops})), dropped_media

    def compare_base(
        self,
        history: Sequence[Message],
        user: str | None,
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        cancel: threading.Event | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
        media: Sequence[Media] = (),
        progress: Callable[[PrefillProgress], None] | None = None,
    ) -> BaseComparison:
        """The reply to ``user`` after ``history`` (the prompt :meth:`stream` renders, without
        tools) decoded greedily with this session's adapters and with none, ``params.max_tokens``
        each: where the two first differ and how far the adapters moved the chosen token's
        probability (engine.inference.base_compare). The worker's adapters and KV cache are put back
        as they were; nothing is saved, and the last prompt (:meth:`prompt_view`) stays the last turn's.

        Args:
            progress: called with each run's prefill progress (on the caller's thread).

        Raises:
            Cancelled: ``cancel`` was set first.
            ContextOverflow: the conversation does not fit and the policy is "refuse".
            EngineCrashed: the worker died; the next call starts a fresh one.
            EngineError: an adapter does not fit any more, or the prompt is empty.
        """
        params = params or GenerationParams()
        with self._lock:
            self._ensure_worker()
            assert self._worker is not None and self.template is not None
            turn = shape_turn(self.template, params, thinking=thinking, reasoning_effort=reasoning_effort)
            _plan, _prompt, tokens, run, _dropped = self._render_turn(
                turn, history, user, params, system, documents, media
            )
            runs = self._worker.compare_base(tokens, run, self._adapters, cancel)
            try:
                while True:
                    event = next(runs)
                    if progress is not None:
                        progress(event)
            except StopIteration as done:
                result: BaseComparison | None = done.value
            except EngineCrashed:
                self._worker = None
                self.last_prompt = []
                raise
            if result is None:
                raise Cancelled("the comparison with the base model was stopped")
            return result

    def _media_history(self, history: Sequence[Message]) -> tuple[list[Message], int]:
        """The history as this model can read it: on a model without a projector the media of
        earlier messages are left out (their text stays), and counted."""
        assert self.info is not None
        if self.info.projector is not None:
            return list(history), 0
        dropped = sum(len(m.media) for m in history)
        if not dropped:
            return list(history), 0
        return [dataclasses.replace(m, media=()) if m.media else m for m in history], dropped

    def result_room(
        self,
        messages: Sequence[Message],
        params: GenerationParams | None = None,
        *,
        system: str | None = None,
        documents: RankedDocuments | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
        thinking: bool | None = None,
        reasoning_effort: str | None = None,
    ) -> int:
        """Tokens left in the window for tool results (engine/agent/loop.py): ``messages`` is the turn
        so far, ending with the ``tool`` messages still empty; the reply reserve is kept free."""
        params = params or GenerationParams()
        with self._lock:
            self._ensure_worker()
            assert self.info is not None and self.template is not None
            turn = shape_turn(
                self.template,
                params,
                tools=tools,
                tool_choice=tool_choice,
                thinking=thinking,
                reasoning_effort=reasoning_effort,
            )
            messages, _dropped = self._media_history(messages)
            self._read_media([m for message in messages for m in message.media])
            fit = self._documents_fit(documents)
            head = system_message(system, fit.text)
            prompt = turn.render([*([head] if head is not None else []), *messages])
            reserve = effective_reserve(self.info.n_ctx, min(self.reply_reserve, params.max_tokens))
            return self.info.n_ctx - reserve - len(self._tokenize_prompt(prompt))

    # raw prompts (the legacy /v1/completions) ---------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        """A text's tokens (llama.cpp's ``/tokenize``): special tokens parsed unless ``special`` is
        false, a BOS first when ``add_bos`` and the model wants one. Starts the worker if needed."""
        with self._lock:
            self._ensure_worker()
            assert self._worker is not None and self.info is not None
            return self._worker.tokenize(text, add_bos=add_bos and self.info.add_bos, special=special)

    def token_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        """The bytes of each token (special tokens as their text; llama.cpp's ``/detokenize``).
        Starts the worker if needed. Raises EngineError for an id outside the vocabulary."""
        with self._lock:
            self._ensure_worker()
            assert self._worker is not None and self.info is not None
            bad = next((t for t in tokens if not 0 <= t < self.info.n_vocab), None)
            if bad is not None:
                raise EngineError(f"token id {bad} is not in this model's vocabulary of {self.info.n_vocab}")
            return self._worker.token_bytes(tokens)

    def tokenize_prompt(self, text: str) -> list[int]:
        """A raw prompt's tokens as the model reads it: special tokens parsed, and a BOS first where
        the model wants one and the text has none. Starts the worker if needed."""
        with self._lock:
            self._ensure_worker()
            return list(self._tokenize_prompt(text))

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        """The text of each token. Starts the worker if needed."""
        with self._lock:
            self._ensure_worker()
            assert self._worker is not None
            return self._worker.pieces(tokens)

    def complete(
        self,
        prompt: str | Sequence[int],
        params: GenerationParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Generates from a raw prompt (text, or token ids), with no chat template, no tools and
        no reply shaping; yields the worker's ``PrefillProgress`` and ``Token`` events, then
        ``Stats`` (``template`` ``"raw"``) and ``Finished`` with the text.

        The session's lock is held throughout, so a chat turn on the same session (the GUI sharing
        it with ``glassbox serve``) never talks to the worker at the same time, and no
        conversation's saved KV cache goes with the prompt.

        Raises:
            ContextOverflow: the prompt and ``params.max_tokens`` do not fit the window.
            EngineError: the prompt is empty.
            EngineCrashed: the worker died; the next call starts a fresh one (on the safe CPU
                variant when the CPU code crashed).
        """
        params = params or GenerationParams()
        check_constraint(params)  # before the worker reads the prompt
        with self._lock:
            self._ensure_worker()
            assert self.info is not None
            tokens = list(self._tokenize_prompt(prompt)) if isinstance(prompt, str) else list(prompt)
            if not tokens:
                raise EngineError("the prompt is empty")
            n_ctx = self.info.n_ctx
            if len(tokens) + params.max_tokens > n_ctx:
                raise ContextOverflow(
                    f"the prompt ({len(tokens)} tokens) and max_tokens ({params.max_tokens}) do not fit "
                    f"the context window of {n_ctx} tokens",
                    n_ctx=n_ctx,
                    prompt_tokens=len(tokens),
                    reserve=params.max_tokens,
                )
            free = n_ctx - len(tokens) - params.max_tokens
            plan = ContextPlan([], 0, len(tokens), {"current": len(tokens), "reserve": params.max_tokens, "free": free})
            self.last_prompt = tokens
            self._prepare(None)
            self._cpu_note = ""
            try:
                result = yield from self._resuming(None)(tokens, params, cancel)
            except EngineCrashed:
                self._worker = None
                self.last_prompt = []
                raise
            stats = dataclasses.replace(self._stats(result, plan), template="raw")
            yield stats
            yield Finished(reason=result.reason, stats=stats, text=result.text, stop_sequence=result.stop_sequence)  # type: ignore[arg-type]

    def _conversation_end(self, turn: TurnShape, plan: ContextPlan, tokens: list[int]) -> int | None:
        """Where the conversation so far ends in the prompt's tokens (before the reply's header):
        the next turn's prompt starts there, so a recurrent model keeps a copy of its state there
        (engine/inference/seq_memory.py). None when that rendering is not a prefix of the prompt."""
        try:
            head = self._tokenize_prompt(turn.render(plan.messages, add_generation_prompt=False))
        except EngineError:
            return None
        return len(head) if 0 < len(head) < len(tokens) and tokens[: len(head)] == head else None

    def _resuming(
        self, cache_key: KvKey | None, checkpoint_at: int | None = None
    ) -> Callable[[Sequence[int], GenerationParams, threading.Event | None], Generator[Any, None, WorkerResult]]:
        """The worker's ``generate``, made to outlive its CPU code.

        When the worker dies of a CPU fault (on load or before its first token, or a SIGILL on the
        AMX variant at any time: engine.inference.runtime), the session moves to the safe variant
        (:meth:`_after_cpu_fault`: remembered for this machine; it raises when the safe one was what
        crashed) and the reply goes on there from the tokens already streamed: the new worker reads
        them after the prompt and its grammar takes them as generated, so nothing shown is lost or
        shown twice. The reply's stats say so (``cpu_note``), once. ``checkpoint_at``: where the
        conversation so far ends in the prompt (a recurrent model keeps its state there).
        """

        def generate(
            tokens: Sequence[int], params: GenerationParams, cancel: threading.Event | None
        ) -> Generator[Any, None, WorkerResult]:
            worker = self._worker
            assert worker is not None
            ids: list[int] = []
            texts: list[str] = []
            try:
                where = {} if checkpoint_at is None else {"checkpoint_at": checkpoint_at}  # a recurrent model's
                return (yield from _recorded(worker.generate(tokens, params, cancel, **where), ids, texts))
            except EngineCrashed as exc:
                if not exc.cpu_fault:
                    raise
                self._worker = None
                crashed = exc.backend.variant if isinstance(exc.backend, BackendInfo) else None
                self.load_params = self._after_cpu_fault(exc, self.load_params)  # raises on the safe one
            self._ensure_worker()
            self._prepare(cache_key)
            fresh = self.worker
            assert fresh is not None
            if ids:
                self._cpu_note = (
                    f"llama.cpp's {crashed} CPU code crashed after {len(ids)} tokens of this reply "
                    f"(SIGILL); the reply went on on the {self.load_params.cpu_variant} variant, and "
                    f"{crashed} is not used on this machine again"
                )
            else:
                self._cpu_note = self.backend_note or ""
            rest = params.max_tokens - len(ids)
            if rest <= 0:  # it died on the last token: the reply is whole
                return WorkerResult("length", "".join(texts), len(tokens), 0, len(ids), len(tokens) + len(ids), 0, 0, 0)
            later_params = params.model_copy(update={"max_tokens": rest})
            try:
                later = yield from fresh.generate(
                    [*tokens, *ids], later_params, cancel, checkpoint_at=checkpoint_at, resume=len(ids)
                )
            except EngineCrashed as again:
                self._worker = None
                if again.cpu_fault:
                    self._after_cpu_fault(again, self.load_params)  # the safe variant too: said, raised
                raise
            return dataclasses.replace(
                later,
                text="".join(texts) + later.text,
                prompt_tokens=len(tokens),
                cached_tokens=min(later.cached_tokens, len(tokens)),
                completion_tokens=len(ids) + later.completion_tokens,
            )

        return generate

    # LoRA adapters (engine.inference.adapters) ------------------------------------------------
    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        """The adapters the next turns run with (empty: the base model)."""
        return self._adapters

    def set_adapters(self, adapters: Sequence[LoraAdapter]) -> None:
        """Runs the next turns with ``adapters``, without reloading the model: loaded in the worker
        on the next turn (and again after a reload). A change of adapters or scales empties the KV
        cache; the next turn's Stats say how many tokens that made it read again.

        Raises:
            ModelFileError: a file is not a LoRA adapter.
            AdapterMismatch: an adapter was made for another model (one line naming both files).
            EngineError: the same file twice.
        """
        wanted = tuple(adapters)
        if len({a.path for a in wanted}) != len(wanted):
            raise EngineError("the same adapter is listed twice")
        for adapter in wanted:
            check_adapter(adapter.path, self.load_params.model_path)
        with self._lock:
            self._adapters = wanted

    def _prepare(self, cache_key: KvKey | None) -> None:
        """Before a generation: the worker gets this turn's saved KV cache and adapters."""
        self._configure_kv(cache_key)
        worker = self._worker
        assert worker is not None
        sent = self._adapters_sent
        if (sent is None and not self._adapters) or (sent is not None and sent == (worker, self._adapters)):
            return
        worker.set_adapters(self._adapters)
        self._adapters_sent = (worker, self._adapters)

    # the KV cache saved on disk --------------------------------------------------------------
    def park(self, config: KvCacheConfig, key: KvKey) -> int:
        """Before the model is unloaded (a pool's idle unload or eviction): when the worker holds a
        prompt that no chat's saved cache holds (the last turn had no ``cache_key``), saves it under
        ``key``; the first turn without a ``cache_key`` after the next load restores it. Returns the
        bytes queued (0: nothing to save). Never raises: a failed save costs only a prefill."""
        with self._lock:
            worker = self._worker
            if worker is None or not worker.alive or self.template is None or not self.last_prompt:
                return 0
            if config.max_bytes <= 0 or (self._kv_sent is not None and self._kv_sent[1] is not None):
                return 0  # nothing to keep, or the chat's own saved cache already holds it
            request = KvRequest(config, key, self._template_identity())
            try:
                saved = worker.park_kv_cache(request)
            except EngineError:
                return 0
            self._parked = request if saved else None
            self._kv_sent = (worker, request)
            return saved

    def _template_identity(self) -> str:
        assert self.template is not None and self.info is not None
        template = hashlib.sha256((self.info.chat_template or "").encode("utf-8")).hexdigest()[:16]
        return f"{self.template.source}:{self.template.name}:{template}"

    def _configure_kv(self, cache_key: KvKey | None) -> None:
        """Tells the worker which saved KV cache this turn uses (only when that changes)."""
        worker = self._worker
        assert worker is not None and self.template is not None and self.info is not None
        request: KvRequest | None = None
        if cache_key is not None and self.kv_cache is not None and self.kv_cache.max_bytes > 0:
            request = KvRequest(self.kv_cache, cache_key, self._template_identity())
        elif cache_key is None and self._parked is not None:
            request, self._parked = self._parked, None  # once: the turn after a reload
        if self._kv_sent is None and request is None:
            return
        if self._kv_sent is not None and self._kv_sent[0] is worker and self._kv_sent[1] == request:
            return
        worker.configure_kv_cache(request)
        self._kv_sent = (worker, request)

    def _stats(self, result: WorkerResult, plan: ContextPlan) -> Stats:
        assert self.info is not None
        new_tokens = result.prompt_tokens - result.cached_tokens
        prefill_tps = new_tokens / (result.prefill_ms / 1000) if result.prefill_ms > 0 else 0.0
        decoded = max(result.completion_tokens - 1, 0)
        decode_tps = decoded / (result.decode_ms / 1000) if result.decode_ms > 0 and decoded else 0.0
        kv_total = kv_cache_bytes(self.gguf, self.info.n_ctx)
        kv_used = kv_cache_bytes(self.gguf, max(result.n_past, 1))
        model_bytes = self.info.model_bytes
        bandwidth = (model_bytes + kv_used) * decode_tps / 1e9
        assert self.template is not None
        return Stats(
            n_ctx=self.info.n_ctx,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            completion_tokens=result.completion_tokens,
            context_used=result.n_past,
            evicted_messages=plan.evicted,
            ttft_ms=round(result.ttft_ms, 2),
            prefill_ms=round(result.prefill_ms, 2),
            decode_ms=round(result.decode_ms, 2),
            prefill_tps=round(prefill_tps, 2),
            decode_tps=round(decode_tps, 2),
            kv_cache_bytes=kv_total,
            kv_used_bytes=kv_used,
            model_bytes=model_bytes,
            bandwidth_gbps=round(bandwidth, 3),
            machine_bandwidth_gbps=self.machine_bandwidth_gbps,
            template=f"{self.template.source}:{self.template.name}",
            draft_tokens=result.draft_tokens,
            accepted_tokens=result.accepted_tokens,
            draft_restores=result.draft_restores,
            speculation_note=result.speculation_note,
            cpu_note=self._cpu_note,
            encode_ms=round(result.encode_ms, 2),
            media_tokens=result.media_tokens,
            media_encoded=result.media_encoded,
            adapters=result.adapters,
            recomputed_tokens=result.recomputed_tokens,
            recompute_ms=result.recompute_ms,
            documents_kept=plan.documents_kept,
            documents_dropped=plan.documents_dropped,
            budget=dict(plan.breakdown),
        )


def _recorded(
    events: Generator[Any, None, WorkerResult], ids: list[int], texts: list[str]
) -> Generator[Any, None, WorkerResult]:
    """Passes ``events`` on, noting each token's id and text; returns the generation's result."""

    while True:
        try:
            event = next(events)
        except StopIteration as done:
            result: WorkerResult = done.value
            return result
        if isinstance(event, Token):
            ids.append(event.token_id)
            texts.append(event.text)
        yield event


def _as_dict(message: Message) -> dict[str, Any]:
    return message.template_dict()
