"""Loading: the GGUF is dequantised once into a cache that later loads reuse; a broken or
stale cache is rebuilt; other sources resolve or fail with a message naming the source."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from engine import Generation, ModelLoadError, SamplerSettings, load_model, resolve_source
from engine.loading import _gguf_cache_dir, _gguf_cache_key, bundled_gguf_path, prune_stale_copies


@pytest.fixture(scope="module")
def gguf_copy(tmp_path_factory):
    """A private copy of the bundled GGUF and an empty cache folder for it."""
    folder = tmp_path_factory.mktemp("gguf")
    path = folder / "model.gguf"
    shutil.copy(bundled_gguf_path(), path)
    return path


def first_token_prob(lm) -> tuple[str, float]:
    step = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0)).step()
    return step.token.text, step.prob


def test_gguf_cold_load_fills_the_cache_and_warm_load_reuses_it(gguf_copy, tmp_path, monkeypatch, lm) -> None:
    monkeypatch.setenv("TOKEN_BY_TOKEN_CACHE", str(tmp_path))
    cold = load_model(str(gguf_copy))
    assert not cold.from_cache and cold.source.kind == "gguf"
    folder = _gguf_cache_dir(gguf_copy, _gguf_cache_key(gguf_copy))
    assert (folder / "manifest.json").is_file() and (folder / "model.safetensors").is_file()
    warm = load_model(str(gguf_copy))
    assert warm.from_cache
    assert warm.eos_ids == cold.eos_ids == (2,) and warm.context_window == 8192
    assert warm.tokenizer.chat_template == cold.tokenizer.chat_template
    for a, b in zip(warm.model.parameters(), cold.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert first_token_prob(warm) == first_token_prob(lm)

    # a damaged cache is detected and rebuilt, not fatal
    (folder / "model.safetensors").write_bytes(b"broken")
    rebuilt = load_model(str(gguf_copy))
    assert not rebuilt.from_cache
    assert first_token_prob(rebuilt) == first_token_prob(lm)
    assert load_model(str(gguf_copy)).from_cache

    # the cache folder is also a plain model folder
    as_folder = load_model(str(folder))
    assert as_folder.source.kind == "folder" and first_token_prob(as_folder) == first_token_prob(lm)


def test_a_changed_gguf_or_library_version_makes_the_cache_stale(gguf_copy) -> None:
    key = _gguf_cache_key(gguf_copy)
    stat = gguf_copy.stat()
    os.utime(gguf_copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        assert _gguf_cache_dir(gguf_copy, _gguf_cache_key(gguf_copy)) != _gguf_cache_dir(gguf_copy, key)
    finally:
        os.utime(gguf_copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    other_version = json.loads(json.dumps(key)) | {"transformers": "0.0.0"}
    assert _gguf_cache_dir(gguf_copy, other_version) != _gguf_cache_dir(gguf_copy, key)


def test_cached_copies_nothing_can_load_are_pruned_and_live_ones_kept(tmp_path) -> None:
    """After a new copy is written: a copy of the same file from before it changed, and a copy
    of a file that is gone, go; a copy of another file that exists, a half-written staging
    folder and another model's copy stay."""
    def gguf(name: str) -> Path:
        path = tmp_path / name / "model.gguf"
        path.parent.mkdir()
        path.write_bytes(b"gguf")
        return path

    def cached(name: str, source: object) -> Path:
        folder = tmp_path / "cache" / name
        folder.mkdir(parents=True)
        if source is not None:
            (folder / "manifest.json").write_text(json.dumps({"gguf": str(source)}))
        return folder

    ours, elsewhere = gguf("checkout"), gguf("other-checkout")
    kept = cached("model-new", ours.resolve())
    superseded = cached("model-old", ours.resolve())
    gone = cached("model-gone", tmp_path / "deleted" / "model.gguf")
    live = cached("model-live", elsewhere.resolve())
    staging = cached("model-new.tmp-123", None)
    another_model = cached("other-gone", tmp_path / "deleted" / "other.gguf")

    assert sorted(prune_stale_copies(kept, ours)) == sorted([superseded, gone])
    assert [f.exists() for f in (kept, superseded, gone, live, staging, another_model)] == [
        True, False, False, True, True, True]


def test_bundled_source_is_the_default() -> None:
    source = resolve_source("")
    assert source.kind == "bundled" and source.location.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.parametrize(("text", "message"), [
    ("./no/such/model.gguf", "No file or folder at './no/such/model.gguf'"),
    ("/etc/hostname", "not a .gguf file"),
    ("/tmp", "has no config.json"),
])
def test_bad_local_sources_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        resolve_source(text)


def test_hub_id_offline_fails_at_once_naming_the_model(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"Cannot load 'someone/not-a-cached-model'.*not reachable"):
        load_model("someone/not-a-cached-model")
