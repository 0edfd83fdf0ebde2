"""Loading: the GGUF is dequantised once into a cache that later loads reuse; a broken or
stale cache is rebuilt; other sources resolve or fail with a message naming the source."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from engine import Generation, ModelLoadError, SamplerSettings, load_model, resolve_source
from engine.loading import (
    _gguf_cache_dir,
    _gguf_cache_key,
    _gguf_parsed_once,
    _put_in_place,
    bundled_gguf_path,
    prune_stale_copies,
)


@pytest.fixture(scope="module")
def gguf_copy(tmp_path_factory):
    """A private copy of the bundled GGUF and an empty cache folder for it."""
    folder = tmp_path_factory.mktemp("gguf")
    path = folder / "model.gguf"
    shutil.copy(bundled_gguf_path(), path)
    return path


def a_copy(folder: Path, key: dict | None, marker: str) -> Path:
    folder.mkdir()
    (folder / "weights").write_text(marker)
    if key is not None:
        (folder / "manifest.json").write_text(json.dumps(key))
    return folder


def test_a_copy_another_process_put_in_place_first_is_kept_and_one_cut_short_is_replaced(tmp_path) -> None:
    key = {"gguf": "model.gguf", "size": 1}
    kept = tmp_path / "model-kept"
    _put_in_place(a_copy(tmp_path / "ours", key, "ours"), a_copy(kept, key, "theirs"), key)
    assert (kept / "weights").read_text() == "theirs"  # a reader of theirs is never cut off
    assert not (tmp_path / "ours").exists()
    short = tmp_path / "model-short"
    _put_in_place(a_copy(tmp_path / "ours2", key, "ours"), a_copy(short, None, "half"), key)
    assert (short / "weights").read_text() == "ours" and not (tmp_path / "ours2").exists()
    fresh = tmp_path / "model-fresh"
    _put_in_place(a_copy(tmp_path / "ours3", key, "ours"), fresh, key)
    assert (fresh / "weights").read_text() == "ours"


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


def test_one_parse_of_the_gguf_gives_transformers_own_weights_and_tokenizer(gguf_copy, lm) -> None:
    """The cold load parses the GGUF once (`_gguf_parsed_once`); transformers on its own parses
    it for each of its reads. Both give the same weights, bit for bit, and the same tokenizer."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_parsed_once(gguf_copy):
        assert gguf.GGUFReader(gguf_copy) is gguf.GGUFReader(str(gguf_copy))
        assert gguf.GGUFReader(bundled_gguf_path()) is not gguf.GGUFReader(bundled_gguf_path())  # another file
    assert gguf.GGUFReader.__name__ == "GGUFReader" and not hasattr(gguf.get_tensor_name_map, "cache_info")

    folder, name = str(gguf_copy.parent), gguf_copy.name
    own = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    assert own.state_dict().keys() == lm.model.state_dict().keys()
    assert all(torch.equal(a, lm.model.state_dict()[k]) for k, a in own.state_dict().items())
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    assert tokenizer.backend_tokenizer.to_str() == lm.tokenizer.backend_tokenizer.to_str()
    assert tokenizer.chat_template == lm.tokenizer.chat_template


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


def test_cached_copies_nothing_should_load_are_pruned_and_the_rest_kept(tmp_path) -> None:
    """After a new copy is written: an older copy of the same file goes, and so does a copy of
    a file that is gone once it has been unused for a month. A recent copy of a missing file
    (maybe another machine's), a copy of another existing file, a half-written staging folder,
    a similarly named model's copy and a folder with a broken manifest stay."""
    def gguf(folder: str, name: str = "model.gguf") -> Path:
        path = tmp_path / folder / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"gguf")
        return path

    def cached(name: str, manifest: object, age_days: float = 0) -> Path:
        folder = tmp_path / "cache" / name
        folder.mkdir(parents=True)
        if manifest is not None:
            (folder / "manifest.json").write_text(json.dumps(manifest))
            then = time.time() - age_days * 24 * 3600
            os.utime(folder / "manifest.json", (then, then))
        return folder

    ours, elsewhere = gguf("checkout"), gguf("other-checkout")
    missing = str(tmp_path / "deleted" / "model.gguf")
    kept = cached("model-" + "a" * 16, {"gguf": str(ours.resolve())})
    superseded = cached("model-" + "b" * 16, {"gguf": str(ours.resolve()), "mtime_ns": 1})
    abandoned = cached("model-" + "c" * 16, {"gguf": missing}, age_days=40)
    recent_missing = cached("model-" + "d" * 16, {"gguf": missing}, age_days=2)
    live = cached("model-" + "e" * 16, {"gguf": str(elsewhere.resolve())})
    staging = cached("model-" + "b" * 16 + ".tmp-123", {"gguf": str(ours.resolve())})
    similar_name = cached("model-v2-" + "f" * 16, {"gguf": str(ours.resolve())})
    broken = cached("model-" + "0" * 16, ["not", "a", "manifest"])

    assert sorted(prune_stale_copies(kept, ours)) == sorted([superseded, abandoned])
    survivors = [kept, recent_missing, live, staging, similar_name, broken]
    assert [f.name for f in survivors if not f.exists()] == []


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
