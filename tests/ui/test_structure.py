"""The app's structure: pages are importable and draw only when run; things the pages share
have one home."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from engine import FINISH_REASONS
from ui.domain.lesson import PRESETS as LESSON_PRESETS
from ui.session.presets import load_presets, preset_named
from ui.views.records import FINISH_LABELS

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "pages").glob("*.py"))
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__": main()`: Streamlit runs a page with __name__ "__main__"."""
    return (isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
            and [ast.unparse(n) for n in node.body] == ["main()"] and not node.orelse)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_a_page_only_defines_things_until_run_as_main(path: Path) -> None:
    body = ast.parse(path.read_text()).body
    docstring, *definitions, last = body
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
    assert all(isinstance(node, DEFINITIONS) for node in definitions), [ast.unparse(n)[:60] for n in definitions
                                                                       if not isinstance(n, DEFINITIONS)]
    assert _is_main_guard(last)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_a_page_imports_without_drawing(path: Path) -> None:
    page = importlib.import_module(f"pages.{path.stem}")
    assert callable(page.main)


def test_every_finish_reason_has_one_label_for_every_page() -> None:
    assert set(FINISH_LABELS) == set(FINISH_REASONS)


def test_one_preset_lookup_serves_the_step_page_and_the_lesson() -> None:
    step_preset, lesson_preset = load_presets()[1], LESSON_PRESETS[2]
    assert preset_named(load_presets(), step_preset.name) is step_preset
    assert preset_named(LESSON_PRESETS, lesson_preset.name) is lesson_preset
    with pytest.raises(ValueError, match="No preset named 'nope'; choose one of: The model ends its turn"):
        preset_named(LESSON_PRESETS, "nope")


def test_the_app_uses_no_private_streamlit_api() -> None:
    """A page reached by its own link gets the frame through public st.navigation (ui/widgets/frame.py),
    not by flipping Streamlit's internal PagesManager: nothing imports streamlit.runtime."""
    for path in [ROOT / "app.py", *(ROOT / "ui").rglob("*.py"), *PAGES]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(name.startswith("streamlit.runtime") for name in names), path.name
