"""Prompt lookup and the draft-length policy (engine.inference.speculative), without a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.inference.runtime import GenerationParams
from engine.inference.speculative import LookupDrafter, SpeculationPolicy, make_drafter


def test_lookup_drafts_what_followed_the_last_ngram() -> None:
    drafter = LookupDrafter([1, 2, 3, 4, 5, 6, 7, 9, 2, 3])
    draft, bucket = drafter.propose(3)
    assert draft == [4, 5, 6]
    assert bucket == "short"  # a 2-token match


def test_lookup_prefers_the_longest_and_most_recent_match() -> None:
    # [2, 3] is followed by 4 early on and by 8 later; [1, 2, 3] only by 8.
    drafter = LookupDrafter([2, 3, 4, 0, 1, 2, 3, 8, 5, 1, 2, 3])
    assert drafter.propose(2)[0] == [8, 5]
    drafter = LookupDrafter([9, 2, 3, 4, 0, 7, 2, 3, 8, 1, 2, 3])
    assert drafter.propose(1)[0] == [8]  # the most recent of equal matches


def test_lookup_grows_with_the_reply_and_reports_long_matches() -> None:
    passage = list(range(100, 140))
    drafter = LookupDrafter([*passage, 7, *passage[:10]])
    draft, bucket = drafter.propose(5)
    assert draft == passage[10:15]
    assert bucket == "long"
    drafter.extend(passage[10:12])
    assert drafter.propose(3)[0] == passage[12:15]


def test_lookup_without_a_match_drafts_nothing() -> None:
    drafter = LookupDrafter([1, 2, 3, 4])
    assert drafter.propose(4) == ([], "")
    assert LookupDrafter([]).propose(4) == ([], "")


def test_policy_drafts_long_matches_and_not_hopeless_ones() -> None:
    policy = SpeculationPolicy(12)
    assert policy.choose("long", 12) >= 6  # a quote: worth a long batch on a CPU
    for _ in range(10):
        policy.record_acceptance("short", 4, 0)
    assert policy.alpha["short"] < 0.1
    assert policy.choose("short", 12) == 0


def test_policy_learns_from_acceptance_and_recovers() -> None:
    policy = SpeculationPolicy(12)
    for _ in range(20):
        policy.record_acceptance("medium", 8, 8)
    assert policy.alpha["medium"] > 0.95
    assert policy.choose("medium", 12) == 12
    for _ in range(20):
        policy.record_acceptance("medium", 8, 0)
    low = policy.alpha["medium"]
    for _ in range(50):
        assert policy.choose("medium", 12) == 0
    assert low < policy.alpha["medium"] < 0.7  # drifts back towards its prior, to try again


def test_policy_on_a_gpu_drafts_more_and_a_costly_draft_model_less() -> None:
    cpu, gpu = SpeculationPolicy(16), SpeculationPolicy(16, offloaded=True)
    assert gpu.choose("medium", 16) > cpu.choose("medium", 16)
    assert SpeculationPolicy(16, draft_cost=0.9).choose("model", 16) == 0
    assert SpeculationPolicy(16, offloaded=True, draft_cost=0.05).choose("model", 16) > 0
    assert cpu.choose("long", 0) == 0


def test_policy_is_deterministic() -> None:
    def run() -> list[int]:
        policy = SpeculationPolicy(12)
        out = []
        for accepted in [3, 0, 8, 8, 1, 12, 0, 0, 5]:
            d = policy.choose("medium", 12)
            out.append(d)
            policy.record_acceptance("medium", max(d, 1), min(accepted, max(d, 1)))
        return out

    assert run() == run()


def test_make_drafter() -> None:
    assert make_drafter("off", [1, 2], None) is None
    assert isinstance(make_drafter("lookup", [1, 2], None), LookupDrafter)
    with pytest.raises(EngineError, match="draft model"):
        make_drafter("draft", [1, 2], None)


def test_params_validate_the_new_fields() -> None:
    with pytest.raises(ValueError, match="cannot both"):
        GenerationParams(grammar='root ::= "a"', json_schema="{}")
    with pytest.raises(ValueError, match="not valid JSON"):
        GenerationParams(json_schema="{nope")
    with pytest.raises(ValueError, match="negative"):
        GenerationParams(logit_bias=((-1, 1.0),))
    with pytest.raises(ValueError, match="logprobs"):
        GenerationParams(logprobs=21)
    with pytest.raises(ValueError, match="speculative"):
        GenerationParams(speculative="sometimes")  # type: ignore[arg-type]
    assert GenerationParams(logprobs=20, logit_bias=((5, float("-inf")),)).logprobs == 20


def test_the_fit_estimate_counts_a_draft_model(starter_model: Path) -> None:
    from engine.fit import draft_model_bytes, estimate_fit
    from engine.gguf import read_gguf_info
    from engine.hardware import HardwareInfo

    info = read_gguf_info(starter_model)
    hw = HardwareInfo(
        total_ram=8 << 30,
        available_ram=7 << 30,
        cpu_count_physical=2,
        cpu_count_logical=2,
        cpu_name="Test CPU",
        gpu_offload_supported=False,
        gpus=[],
    )
    alone = estimate_fit(info, hw, 4096)
    paired = estimate_fit(info, hw, 4096, draft=info)
    extra = draft_model_bytes(info, 4096)
    assert extra > info.tensor_bytes  # weights, plus its own KV cache and buffers
    assert paired.total_bytes == alone.total_bytes + extra
    assert paired.weights_bytes == alone.weights_bytes + extra


def test_policy_drafts_more_for_a_model_whose_output_layer_is_small() -> None:
    small_head = SpeculationPolicy(16, head_share=0.07)  # a 7B model with a 152k vocabulary
    big_head = SpeculationPolicy(16, head_share=0.62)  # the starter
    assert small_head.cost(8) < big_head.cost(8)
    small_head.alpha["medium"] = big_head.alpha["medium"] = 0.85
    assert small_head.choose("medium", 16) > big_head.choose("medium", 16) > 0
