"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel (nbclient), on the
real model, and shows what its text promises: so the notebooks never rot."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.model  # each kernel loads the real model
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def run(name: str) -> list[dict]:
    """Execute a notebook as CI would open it (its folder the working directory) and return its
    code cells' outputs, cell by cell: every stream's text and every rich output's data."""
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(book, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    cells = []
    for cell in book.cells:
        if cell.cell_type == "code":
            outputs = cell.get("outputs", [])
            cells.append({"text": "".join(o.get("text", "") for o in outputs),
                          "data": {k: v for o in outputs for k, v in o.get("data", {}).items()}})
    return cells


def test_the_tour_steps_samples_looks_inside_breaks_the_chain_and_steps_a_widget(tmp_path) -> None:
    cells = run("tour.ipynb")
    text = "\n".join(c["text"] for c in cells)
    html = [c["data"].get("text/html", "") for c in cells]
    assert "' Paris' raw probability 0.773, rank 1" in text  # the model's own numbers
    assert "same seed, same text: True" in text
    step = next(h for h in html if "Next-token distribution at step 1" in h)
    assert "77.3%" in step and "tbt-bars-pick" in step
    assert any('data-steps="6"' in h for h in html)  # the generation after six steps, as chips
    assert any("forward pass" in h and "tbt-lens-cell" in h for h in html)
    assert any("tbt-nb" in h and "bc-" in h for h in html)  # the speculative rounds' pictures
    widget = next(c for c in cells if "application/vnd.jupyter.widget-view+json" in c["data"]
                  and "A still of the Stepper" in c["data"].get("text/html", ""))
    assert widget["data"]["text/html"].count("tbt-chip") > 0
    assert "Step 2. ' Paris.'" in text


def test_the_sampler_exercise_finds_the_mistake_it_starts_with(tmp_path) -> None:
    text = "\n".join(c["text"] for c in run("exercise_sampler.ipynb"))
    assert re.search(r"top-p", text) and "differs" in text.lower()


def test_the_stop_exercise_finds_the_mistake_it_starts_with(tmp_path) -> None:
    text = "\n".join(c["text"] for c in run("exercise_stop.ipynb"))
    assert "differs" in text.lower()


def pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", path.read_text(), re.MULTILINE))


def test_the_notebooks_install_the_versions_the_project_tests() -> None:
    tested = pins(ROOT / "requirements.txt") | pins(ROOT / "requirements-dev.txt")
    wanted = pins(NOTEBOOKS / "requirements.txt")
    assert wanted and {name: tested.get(name) for name in wanted} == wanted


def test_each_notebook_opens_in_colab_from_the_readme_and_from_itself() -> None:
    readme = (ROOT / "README.md").read_text()
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        book = nbformat.read(path, as_version=4)
        badge = f"/blob/main/notebooks/{path.name})"
        assert badge in readme and badge in book.cells[1].source, path.name
        setup = book.cells[2].source
        repository = re.search(r'REPOSITORY = "https://github.com/([^"]+)"', setup).group(1)
        assert f"colab.research.google.com/github/{repository}{badge}" in readme
