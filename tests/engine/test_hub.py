"""engine.hub.search against the loopback fake Hub: search, listing, grouping, refusals, HTTP errors."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from hub_server import FakeHub, random_bytes

from engine.errors import DownloadError
from engine.hub.http import (
    GatedRepoError,
    HubHTTPError,
    OfflineError,
    RateLimitedError,
    RepoNotFoundError,
    resolve_endpoint,
    retry_after_seconds,
)
from engine.hub.search import (
    ModelChoice,
    ModelFile,
    check_filename,
    check_repo_id,
    list_repo_files,
    parse_quant,
    parse_split,
    search_models,
    unsafe_name_reason,
)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        server.add_repo(
            "alice/Llama-3-8B-GGUF",
            {
                "Llama-3-8B-Q4_K_M.gguf": random_bytes(3000, 1),
                "Llama-3-8B-Q8_0.gguf": random_bytes(5000, 2),
                "Llama-3-8B-IQ4_XS.gguf": random_bytes(2500, 3),
                "README.md": b"# readme\n",
            },
            downloads=500,
            likes=3,
            last_modified="2024-05-01T00:00:00.000Z",
        )
        server.add_repo(
            "bob/llama-vision-GGUF",
            {
                "model-Q4_K_M.gguf": random_bytes(1000, 4),
                "mmproj-model-f16.gguf": random_bytes(100, 5),
                "BF16/model-BF16-00001-of-00003.gguf": random_bytes(700, 6),
                "BF16/model-BF16-00002-of-00003.gguf": random_bytes(700, 7),
                "BF16/model-BF16-00003-of-00003.gguf": random_bytes(600, 8),
                "BF16/mmproj-BF16.gguf": random_bytes(90, 9),
                "Q2_K/model-Q2_K-00001-of-00002.gguf": random_bytes(300, 10),
            },
            downloads=100,
            likes=40,
            last_modified="2025-02-01T00:00:00.000Z",
        )
        server.add_repo("carol/old-llama", {"pytorch_model.bin": b"pickle", "config.json": b"{}"})
        server.add_repo(
            "dave/llama-safetensors", {"model.safetensors": b"st", "training_args.bin": b"p", "config.json": b"{}"}
        )
        server.add_repo(
            "erin/gated-llama-GGUF",
            {"g-Q4_0.gguf": random_bytes(400, 11)},
            gated=True,
            token="hf_secret",
            downloads=7,
            likes=1,
        )
        server.add_repo(
            "mallory/evil-GGUF",
            {
                "good-Q4_K_M.gguf": random_bytes(100, 12),
                "../evil.gguf": b"x",
                "/etc/x.gguf": b"x",
                "C:\\x.gguf": b"x",
                "dir\\y.gguf": b"x",
            },
        )
        yield server


# ---------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Llama-3-8B-Q4_K_M.gguf", "Q4_K_M"),
        ("llama-3-8b.q4_k_m.gguf", "Q4_K_M"),
        ("model-IQ4_XS.gguf", "IQ4_XS"),
        ("model-IQ2_XXS.gguf", "IQ2_XXS"),
        ("model-IQ4_NL.gguf", "IQ4_NL"),
        ("model-Q8_0.gguf", "Q8_0"),
        ("model-Q5_K_S.gguf", "Q5_K_S"),
        ("model-Q6_K.gguf", "Q6_K"),
        ("model-F16.gguf", "F16"),
        ("model-fp16.gguf", "F16"),
        ("model-BF16-00001-of-00003.gguf", "BF16"),
        ("BF16/model-00001-of-00002.gguf", None),
        ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("model-MXFP4.gguf", "MXFP4"),
        ("ggml-model.gguf", None),
        ("Q4_K_M-not-a-quantQ4.gguf", "Q4_K_M"),
    ],
)
def test_parse_quant_reads_the_type_from_the_name(name: str, quant: str | None) -> None:
    assert parse_quant(name) == quant


def test_parse_split_finds_part_and_total() -> None:
    assert parse_split("a/model-00002-of-00005.gguf") == (2, 5)
    assert parse_split("model.gguf") is None
    assert parse_split("model-00007-of-00005.gguf") is None
    assert parse_split("model-00000-of-00005.gguf") is None


@pytest.mark.parametrize(
    "name",
    [
        "../evil.gguf",
        "a/../../b.gguf",
        "/etc/x.gguf",
        "C:\\x.gguf",
        "C:x.gguf",
        "\\\\server\\share\\x.gguf",
        "dir\\y.gguf",
        "a\x00b.gguf",
        "",
        "a//b.gguf",
        "./a.gguf",
        "CON.gguf",
        "aux",
        "x" * 300 + ".gguf",
        "trailing. ",
    ],
)
def test_unsafe_names_are_refused(name: str) -> None:
    assert unsafe_name_reason(name) is not None
    with pytest.raises(DownloadError, match="unsafe file name"):
        check_filename(name)


@pytest.mark.parametrize("name", ["model-Q4_K_M.gguf", "BF16/model-00001-of-00002.gguf", "a.b-c_d.gguf"])
def test_safe_names_pass(name: str) -> None:
    assert unsafe_name_reason(name) is None
    assert check_filename(name) == name


@pytest.mark.parametrize("repo", ["alice", "a/b/c", "../x", "a/..", "a b/c", "https://x/y", ""])
def test_bad_repo_ids_are_refused(repo: str) -> None:
    with pytest.raises(DownloadError, match="not a Hugging Face repository id"):
        check_repo_id(repo)


def test_endpoint_comes_from_argument_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert resolve_endpoint(None) == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert resolve_endpoint(None) == "http://127.0.0.1:9"
    assert resolve_endpoint("https://mirror.example/") == "https://mirror.example"
    with pytest.raises(DownloadError, match="not a valid Hugging Face endpoint"):
        resolve_endpoint("ftp://x")


def test_retry_after_accepts_seconds_and_dates() -> None:
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "nonsense"}) is None
    assert retry_after_seconds({"retry-after": "99999"}) == 300.0
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    wait = retry_after_seconds({"retry-after": date})
    assert wait is not None
    assert 25 <= wait <= 31


# ----------------------------------------------------------------------------------- search


def test_search_sorts_and_filters(hub: FakeHub) -> None:
    by_downloads = search_models("llama", "downloads", endpoint=hub.url)
    assert [r.id for r in by_downloads] == ["alice/Llama-3-8B-GGUF", "bob/llama-vision-GGUF", "erin/gated-llama-GGUF"]
    assert by_downloads[0].downloads == 500
    assert by_downloads[0].likes == 3
    assert by_downloads[0].last_modified == "2024-05-01T00:00:00.000Z"
    assert [r.gated for r in by_downloads] == [False, False, True]
    assert search_models("llama", "likes", endpoint=hub.url)[0].id == "bob/llama-vision-GGUF"
    assert [r.id for r in search_models("llama", "recent", limit=1, endpoint=hub.url)] == ["bob/llama-vision-GGUF"]
    method, path, _ = hub.requests[0]
    assert method == "GET"
    assert "filter=gguf" in path
    assert "sort=downloads" in path
    assert "expand=lastModified" in path


def test_search_uses_hf_endpoint_from_environment(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    assert [r.id for r in search_models("vision")] == ["bob/llama-vision-GGUF"]


def test_search_refuses_bad_arguments() -> None:
    with pytest.raises(DownloadError, match="unknown sort order"):
        search_models("x", "stars", endpoint="http://127.0.0.1:9")  # type: ignore[arg-type]
    with pytest.raises(DownloadError, match="between 1 and 1000"):
        search_models("x", limit=0, endpoint="http://127.0.0.1:9")


# ---------------------------------------------------------------------------------- listing


def test_listing_gives_sizes_hashes_and_quants(hub: FakeHub) -> None:
    files = list_repo_files("alice/Llama-3-8B-GGUF", endpoint=hub.url)
    assert files.commit == hub.repos["alice/Llama-3-8B-GGUF"].commit
    q4 = files.find("Llama-3-8B-Q4_K_M.gguf")
    assert q4 is not None
    assert q4.size == 3000
    assert q4.quant == "Q4_K_M"
    import hashlib

    assert q4.sha256 == hashlib.sha256(random_bytes(3000, 1)).hexdigest()
    readme = files.find("README.md")
    assert readme is not None
    assert readme.sha256 is None
    assert [c.quant for c in files.choices] == ["IQ4_XS", "Q4_K_M", "Q8_0"]  # smallest first
    assert all(c.complete and len(c.files) == 1 for c in files.choices)
    # the tree is read at the resolved commit, so the listing is consistent
    assert any(f"/tree/{files.commit}" in path for _, path, _ in hub.requests)


@pytest.mark.parametrize(
    ("model", "offered", "chosen"),
    [
        ("gemma-3-4b-it-Q4_K_M.gguf", ["mmproj-F32.gguf", "mmproj-BF16.gguf", "mmproj-F16.gguf"], "mmproj-F16.gguf"),
        (
            "Q4/SmolVLM2-2.2B-Instruct-Q4_K_M.gguf",
            ["mmproj-SmolVLM2-500M-f16.gguf", "mmproj-SmolVLM2-2.2B-Instruct-Q8_0.gguf"],
            "mmproj-SmolVLM2-2.2B-Instruct-Q8_0.gguf",  # the closer name wins over the better type
        ),
        ("model-Q4_K_M.gguf", ["mmproj-Q8_0.gguf"], "mmproj-Q8_0.gguf"),
        ("model-Q4_K_M.gguf", [], None),
    ],
    ids=["best-type", "closest-name", "only-one", "none"],
)
def test_a_choice_downloads_the_one_projector_a_load_picks(model: str, offered: list[str], chosen: str | None) -> None:
    files = (ModelFile(model, 1000, None),)
    choice = ModelChoice(model, "Q4_K_M", files, tuple(ModelFile(n, 10, None, is_mmproj=True) for n in offered))
    assert (choice.projector.filename if choice.projector else None) == chosen
    assert choice.to_dict()["projector"] == chosen
    assert len(choice.to_dict()["mmproj"]) == len(offered)  # all still listed


def test_split_parts_are_grouped_and_mmproj_paired(hub: FakeHub) -> None:
    files = list_repo_files("bob/llama-vision-GGUF", endpoint=hub.url)
    by_name = {c.name: c for c in files.choices}
    assert set(by_name) == {"model-Q4_K_M.gguf", "BF16/model-BF16.gguf", "Q2_K/model-Q2_K.gguf"}
    bf16 = by_name["BF16/model-BF16.gguf"]
    assert bf16.quant == "BF16"
    assert [f.split for f in bf16.files] == [(1, 3), (2, 3), (3, 3)]
    assert bf16.total_size == 2000
    assert bf16.complete
    assert [m.filename for m in bf16.mmproj] == ["BF16/mmproj-BF16.gguf"]  # same folder wins
    q4 = by_name["model-Q4_K_M.gguf"]
    assert [m.filename for m in q4.mmproj] == ["mmproj-model-f16.gguf"]
    assert not by_name["Q2_K/model-Q2_K.gguf"].complete  # part 2 of 2 is missing
    assert {m.filename for m in files.mmproj} == {"mmproj-model-f16.gguf", "BF16/mmproj-BF16.gguf"}
    assert all(not c.name.startswith("mmproj") for c in files.choices)
    document = files.to_dict()
    assert document["choices"][0]["total_size"] > 0


def test_a_single_file_and_a_split_set_with_the_same_stem_stay_apart() -> None:
    from engine.hub.search import build_repo_files

    entries = [
        {"type": "file", "path": p, "size": 10} for p in ("m.gguf", "m-00001-of-00002.gguf", "m-00002-of-00002.gguf")
    ]
    files = build_repo_files("a/b", "main", None, entries)
    by_name = {c.name: [f.filename for f in c.files] for c in files.choices}
    assert by_name == {
        "m.gguf": ["m.gguf"],
        "m-00001-of-00002.gguf": ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"],
    }


def test_listing_follows_pagination() -> None:
    with FakeHub(page_size=2) as server:
        names = {f"m-{i:02d}-Q4_0.gguf": random_bytes(10, i) for i in range(7)}
        server.add_repo("p/paged-GGUF", names)
        files = list_repo_files("p/paged-GGUF", endpoint=server.url)
        assert {f.filename for f in files.files} == set(names)
        assert server.count("GET", "/tree/") == 4


def test_pickle_only_repo_is_refused(hub: FakeHub) -> None:
    with pytest.raises(DownloadError) as caught:
        list_repo_files("carol/old-llama", endpoint=hub.url)
    assert str(caught.value) == (
        "carol/old-llama: contains only pickle weights (unsafe to load); Glassbox only uses GGUF or safetensors"
    )


def test_safetensors_repo_is_listed_as_convertible(hub: FakeHub) -> None:
    files = list_repo_files("dave/llama-safetensors", endpoint=hub.url)
    assert files.has_safetensors
    assert files.choices == ()


def test_unsafe_names_in_a_listing_are_set_aside(hub: FakeHub) -> None:
    files = list_repo_files("mallory/evil-GGUF", endpoint=hub.url)
    assert [f.filename for f in files.files] == ["good-Q4_K_M.gguf"]
    assert set(files.unsafe_names) == {"../evil.gguf", "/etc/x.gguf", "C:\\x.gguf", "dir\\y.gguf"}


# ------------------------------------------------------------------------------ HTTP errors


def test_gated_repo_needs_a_token(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(GatedRepoError) as caught:
        list_repo_files("erin/gated-llama-GGUF", endpoint=hub.url)
    assert str(caught.value) == (
        "erin/gated-llama-GGUF: gated or private: accept the licence on the model page and set HF_TOKEN"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    files = list_repo_files("erin/gated-llama-GGUF", endpoint=hub.url)
    assert files.gated
    assert [c.quant for c in files.choices] == ["Q4_0"]


def test_forbidden_is_reported_as_gated(hub: FakeHub) -> None:
    hub.faults.status.append(("/revision/", 403, 1, None))
    with pytest.raises(GatedRepoError, match="accept the licence"):
        list_repo_files("alice/Llama-3-8B-GGUF", endpoint=hub.url)


def test_missing_repo_and_revision_are_404(hub: FakeHub) -> None:
    with pytest.raises(RepoNotFoundError, match="nobody/nothing: no such repository/file"):
        list_repo_files("nobody/nothing", endpoint=hub.url)
    with pytest.raises(RepoNotFoundError):
        list_repo_files("alice/Llama-3-8B-GGUF", revision="v9", endpoint=hub.url)


def test_rate_limit_is_retried_after_the_servers_delay(hub: FakeHub) -> None:
    hub.faults.status.append(("/api/models?", 429, 2, 0.2))
    began = time.monotonic()
    results = search_models("llama", endpoint=hub.url, backoff_s=0.01)
    assert len(results) == 3
    assert time.monotonic() - began >= 0.4  # two waits of Retry-After: 0.2
    assert hub.count("GET", "/api/models?") == 3


def test_persistent_rate_limit_gives_a_clear_error(hub: FakeHub) -> None:
    hub.faults.status.append(("/api/models?", 429, 99, 0.05))
    with pytest.raises(RateLimitedError, match=r"search: rate limited by http://127\.0\.0\.1:\d+; try again"):
        search_models("llama", endpoint=hub.url, retries=2, backoff_s=0.01)
    assert hub.count("GET", "/api/models?") == 3


def test_server_errors_are_retried_then_reported(hub: FakeHub) -> None:
    hub.faults.status.append(("/revision/", 503, 1, None))
    assert list_repo_files("alice/Llama-3-8B-GGUF", endpoint=hub.url, backoff_s=0.01).choices
    hub.faults.status.append(("/revision/", 500, 9, None))
    with pytest.raises(HubHTTPError, match="HTTP 500"):
        list_repo_files("alice/Llama-3-8B-GGUF", endpoint=hub.url, retries=1, backoff_s=0.01)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_endpoint_is_offline() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(OfflineError) as caught:
        search_models("llama", endpoint=endpoint, retries=1, backoff_s=0.01)
    assert str(caught.value).startswith(f"offline: cannot reach {endpoint}")
    assert "\n" not in str(caught.value)


def test_unknown_host_is_offline() -> None:
    with pytest.raises(OfflineError, match=r"offline: cannot reach http://no-such-host\.invalid"):
        search_models("llama", endpoint="http://no-such-host.invalid", retries=0)


def test_token_goes_only_to_the_hub_host(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    search_models("llama", endpoint=hub.url)
    _, _, headers = hub.requests[-1]
    assert headers.get("Authorization") == "Bearer hf_secret"
