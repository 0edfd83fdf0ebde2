"""The app's server sets OpenMP's wait policy before torch loads (OpenMP reads it only then)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**base, **env},
                            capture_output=True, text=True, timeout=120, check=True)
    return result.stdout.strip()


def test_the_ui_package_sets_a_passive_wait_before_anything_the_app_imports_loads_torch() -> None:
    # app.py imports streamlit, then the ui package: torch must not be loaded yet at that point
    code = ("import sys, os, streamlit; loaded = 'torch' in sys.modules; import ui; "
            "print(loaded, os.environ.get('OMP_WAIT_POLICY'))")
    assert _run(code) == "False PASSIVE"


def test_an_explicit_wait_policy_is_left_alone() -> None:
    assert _run("import os, ui; print(os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


def test_the_app_imports_the_ui_package_before_the_engine_loads_torch() -> None:
    import ast

    tree = ast.parse((ROOT / "app.py").read_text())
    modules = [node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
               for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert modules.index("ui") < modules.index("engine")


def test_no_wait_policy_is_set_once_torch_has_loaded() -> None:
    """OpenMP has read the variable by then; setting it later would tell the exact rows kernel
    that OpenMP's threads sleep when they spin."""
    assert _run("import os, torch, ui; print(os.environ.get('OMP_WAIT_POLICY'))") == "None"
