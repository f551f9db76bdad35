"""LoRA adapters: the header checks against a base (llama.cpp's own checks, from both headers), and
adapters on the real starter model, applied, rescaled and removed without a reload: scale 0 is the
base, scale 1 is not, a change empties the KV cache and says what it cost, a saved KV cache is
restored only for the adapters it was made with, a mismatched adapter is refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lora_fixtures import write_gguf_lora
from tiny_models import write_tiny_llama_gguf

from engine.errors import EngineError, ModelFileError
from engine.gguf import read_gguf_info
from engine.inference.adapters import LoraAdapter, adapters_label
from engine.inference.events import Finished, Token
from engine.inference.kv_cache import KvCacheConfig, KvKey
from engine.inference.runtime import GenerationParams, LoadParams
from engine.inference.session import ChatSession
from engine.lora import AdapterMismatch, check_adapter, is_adapter, read_adapter

GREEDY = GenerationParams(max_tokens=12, temperature=0.0, logprobs=1)


# --------------------------------------------------------------------------- the header checks


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("base") / "tiny.gguf", n_layer=2)


def test_an_adapter_is_read_and_fits_its_base(tiny: Path, tmp_path: Path) -> None:
    adapter = write_gguf_lora(tmp_path / "a.gguf", tiny, rank=8, alpha=16)
    info = read_adapter(adapter)
    assert (info.architecture, info.alpha, info.rank) == ("llama", 16.0, 8)
    assert info.targets == (
        "blk.0.attn_q.weight",
        "blk.0.attn_v.weight",
        "blk.1.attn_q.weight",
        "blk.1.attn_v.weight",
    )
    assert check_adapter(adapter, tiny) == info
    assert is_adapter(read_gguf_info(adapter)) and not is_adapter(read_gguf_info(tiny))


def test_a_model_is_not_an_adapter_and_an_adapter_is_not_a_base(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"tiny.gguf: not a LoRA adapter \(general.type is 'model'\)"):
        read_adapter(tiny)
    adapter = write_gguf_lora(tmp_path / "a.gguf", tiny)
    with pytest.raises(ModelFileError, match=r"a\.gguf: this is a LoRA adapter, not a model to apply one to"):
        check_adapter(adapter, adapter)


def test_an_adapter_of_another_architecture_is_refused_naming_both_files(tiny: Path, tmp_path: Path) -> None:
    adapter = write_gguf_lora(tmp_path / "other.gguf", tiny, architecture="qwen2")
    with pytest.raises(AdapterMismatch) as caught:
        check_adapter(adapter, tiny)
    message = str(caught.value)
    assert message == f"{adapter}: does not fit {tiny}: it is for the qwen2 architecture, the model is llama"
    assert "\n" not in message


def test_an_adapter_of_other_shapes_is_refused(tiny: Path, tmp_path: Path) -> None:
    adapter = write_gguf_lora(tmp_path / "wide.gguf", tiny, shape_of={"attn_q": (512, 256)})
    with pytest.raises(
        AdapterMismatch, match=r"blk.0.attn_q.weight is 256x256 in the model, the adapter's pair is for"
    ):
        check_adapter(adapter, tiny)


def test_an_adapter_for_a_deeper_model_is_refused(tmp_path: Path) -> None:
    deep = write_tiny_llama_gguf(tmp_path / "deep.gguf", n_layer=3)
    shallow = write_tiny_llama_gguf(tmp_path / "shallow.gguf", n_layer=2)
    adapter = write_gguf_lora(tmp_path / "deep-lora.gguf", deep)
    check_adapter(adapter, deep)
    with pytest.raises(AdapterMismatch, match=r"it changes blk\.2\.attn_q\.weight, which the model does not have"):
        check_adapter(adapter, shallow)


def test_an_adapter_pair_missing_half_or_a_stray_tensor_is_a_bad_file(tiny: Path, tmp_path: Path) -> None:
    import gguf
    import numpy as np

    for name, tensors, why in (
        ("half.gguf", {"blk.0.attn_q.weight.lora_a": (4, 256)}, "pair of 'blk.0.attn_q.weight' is missing its lora_b"),
        ("stray.gguf", {"blk.0.attn_q.weight": (256, 256)}, "neither a .lora_a nor a .lora_b"),
    ):
        writer = gguf.GGUFWriter(str(tmp_path / name), "llama")
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        for tensor, shape in tensors.items():
            writer.add_tensor(tensor, np.zeros(shape, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(ModelFileError, match=why):
            read_adapter(tmp_path / name)


def test_a_scale_must_be_a_finite_number_in_range() -> None:
    with pytest.raises(EngineError, match="scale must be a number"):
        LoraAdapter(Path("a.gguf"), float("nan"))
    with pytest.raises(EngineError, match="scale must be a number"):
        LoraAdapter(Path("a.gguf"), 1000.0)
    assert adapters_label([LoraAdapter(Path("/x/a.gguf"), 0.5), LoraAdapter(Path("/x/b.gguf"), 0)]) == "a.gguf:0.5"


# --------------------------------------------------------------------------- on the real starter model


@pytest.fixture(scope="module")
def starter_lora(starter_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf_lora(tmp_path_factory.mktemp("lora") / "starter-lora.gguf", starter_model, strength=1.0)


@pytest.fixture
def session(starter_model: Path) -> Iterator[ChatSession]:
    with ChatSession(LoadParams(model_path=starter_model, n_ctx=1024, n_threads=2), reply_reserve=64) as s:
        s.load()
        yield s


def _reply(session: ChatSession, user: str = "Write one sentence about the sea.", **kw: object) -> Finished:
    events = list(session.stream([], user, GREEDY, **kw))  # type: ignore[arg-type]
    finished = events[-1]
    assert isinstance(finished, Finished)
    return finished


def _tokens(session: ChatSession, **kw: object) -> list[tuple[int, float | None]]:
    events = list(session.stream([], "Write one sentence about the sea.", GREEDY, **kw))  # type: ignore[arg-type]
    return [(e.token_id, e.logprob) for e in events if isinstance(e, Token)]


@pytest.mark.model
def test_scale_zero_is_the_base_and_scale_one_is_not_without_a_reload(session: ChatSession, starter_lora: Path) -> None:
    assert session.worker is not None
    pid = session.worker.pid
    base = _tokens(session)
    session.set_adapters([LoraAdapter(starter_lora, 0.0)])
    assert _tokens(session) == base  # token for token, log-probability for log-probability
    session.set_adapters([LoraAdapter(starter_lora, 1.0)])
    adapted = _tokens(session)
    assert [t for t, _ in adapted] != [t for t, _ in base]
    session.set_adapters([LoraAdapter(starter_lora, 0.5)])
    half = _tokens(session)
    assert half != adapted and half != base
    session.set_adapters([])
    assert _tokens(session) == base
    assert session.worker is not None and session.worker.pid == pid  # never reloaded


@pytest.mark.model
def test_a_change_of_adapter_empties_the_cache_and_the_stats_say_what_it_cost(
    session: ChatSession, starter_lora: Path
) -> None:
    first = _reply(session)
    assert first.stats.adapters == "" and first.stats.recomputed_tokens == 0
    again = _reply(session)
    assert again.stats.cached_tokens == again.stats.prompt_tokens - 1  # the cache kept the prompt
    session.set_adapters([LoraAdapter(starter_lora, 1.0)])
    changed = _reply(session)
    assert changed.stats.adapters == "starter-lora.gguf:1"
    assert changed.stats.cached_tokens == 0
    assert changed.stats.recomputed_tokens == changed.stats.prompt_tokens - 1
    assert 0 < changed.stats.recompute_ms <= changed.stats.prefill_ms
    same = _reply(session)  # the same adapters: the cache is reused again
    assert same.stats.recomputed_tokens == 0 and same.stats.cached_tokens == same.stats.prompt_tokens - 1
    session.set_adapters([LoraAdapter(starter_lora, 1.0)])  # setting the same again changes nothing
    assert _reply(session).stats.recomputed_tokens == 0


@pytest.mark.model
def test_a_saved_kv_cache_is_restored_only_for_the_adapters_it_was_made_with(
    starter_model: Path, starter_lora: Path, tmp_path: Path
) -> None:
    kv = KvCacheConfig(tmp_path / "kv")
    key = KvKey("chat-1")
    question = "Tell me about the river that runs past the old town. " * 8
    load = LoadParams(model_path=starter_model, n_ctx=1024, n_threads=2)
    with ChatSession(load, kv_cache=kv, reply_reserve=64) as s:
        s.set_adapters([LoraAdapter(starter_lora, 1.0)])
        saved = _reply(s, question, cache_key=key)
        assert saved.stats.kv_saved_bytes > 0
    with ChatSession(load, kv_cache=kv, reply_reserve=64) as s:  # a fresh worker, the same adapter
        s.set_adapters([LoraAdapter(starter_lora, 1.0)])
        restored = _reply(s, question, cache_key=key)
        assert restored.stats.kv_restored_tokens == restored.stats.prompt_tokens - 1
    with ChatSession(load, kv_cache=kv, reply_reserve=64) as s:  # the base model: not its state
        base = _reply(s, question, cache_key=key)
        assert base.stats.kv_restored_tokens == 0 and base.stats.cached_tokens == 0
        assert base.text != saved.text


@pytest.mark.model
def test_a_mismatched_adapter_is_refused_and_the_session_keeps_its_adapters(
    session: ChatSession, starter_model: Path, starter_lora: Path, tmp_path: Path
) -> None:
    other = write_gguf_lora(tmp_path / "llama-lora.gguf", starter_model, architecture="llama")
    session.set_adapters([LoraAdapter(starter_lora, 1.0)])
    with pytest.raises(AdapterMismatch) as caught:
        session.set_adapters([LoraAdapter(other, 1.0)])
    assert str(caught.value) == (
        f"{other}: does not fit {starter_model}: it is for the llama architecture, the model is gemma3"
    )
    with pytest.raises(ModelFileError, match="not a LoRA adapter"):
        session.set_adapters([LoraAdapter(starter_model, 1.0)])
    with pytest.raises(EngineError, match="listed twice"):
        session.set_adapters([LoraAdapter(starter_lora, 1.0), LoraAdapter(starter_lora, 0.5)])
    assert session.adapters == (LoraAdapter(starter_lora, 1.0),)
    assert _reply(session).stats.adapters == "starter-lora.gguf:1"
