"""ui/'s rooms keep their layers (ARCHITECTURE.md, ui/): only the widgets and the server draw
with or hold Streamlit; controllers, views, the domain and the session never import it; views
never import a controller; pages and app.py name ui's pieces only through a room's public names
(`from ui.controllers import sampler_lab as lab`, `from ui.views import PANEL_CSS`)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "ui"
ROOMS = sorted(p.name for p in UI.iterdir() if (p / "__init__.py").exists())
STREAMLIT_ROOMS = {"widgets", "server"}  # what draws, and the server's cached singletons
# a room may import nothing from these rooms (besides Streamlit, above)
FORBIDDEN = {
    "views": {"controllers", "widgets", "server", "session"},
    "domain": {"controllers", "widgets"},
    "controllers": {"widgets"},
    "session": {"controllers", "widgets"},
    "server": {"controllers", "widgets"},
    "widgets": {"controllers"},
    "notebook": {"controllers", "widgets", "server", "session"},  # the engine and the views, in a notebook
}
ENTRY_POINTS = sorted([ROOT / "app.py", *(ROOT / "pages").glob("*.py")])


def imported_modules(source: str) -> list[str]:
    """Every module a source imports, at any depth (imports inside functions count too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def layering_problems(room: str, source: str) -> list[str]:
    """What a module of `room` imports that its layer may not."""
    problems = []
    for module in imported_modules(source):
        top, _, rest = module.partition(".")
        if top == "streamlit" and room not in STREAMLIT_ROOMS:
            problems.append(f"imports {module}: only {sorted(STREAMLIT_ROOMS)} use Streamlit")
        if top == "ui" and rest.split(".")[0] in FORBIDDEN.get(room, ()):
            problems.append(f"imports {module}: {room} sits below {rest.split('.')[0]}")
    return problems


def entry_point_problems(source: str) -> list[str]:
    """Imports of a page or app.py that reach inside a room (`from ui.controllers.lesson import`)."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ui."):
            if node.module.count(".") > 1:
                problems.append(f"from {node.module} import …: name it through ui.{node.module.split('.')[1]}")
        elif isinstance(node, ast.Import):
            problems += [f"import {a.name}: use `from ui.<room> import …`" for a in node.names
                         if a.name.startswith("ui.")]
    return problems


def test_the_rooms_are_the_ones_the_layering_speaks_of() -> None:
    assert ROOMS == ["controllers", "domain", "notebook", "server", "session", "views", "widgets"]
    assert [p.name for p in UI.glob("*.py")] == ["__init__.py"]  # every module sits in a room


@pytest.mark.parametrize("room", ["controllers", "domain", "notebook", "server", "session", "views", "widgets"])
def test_each_rooms_modules_import_only_what_their_layer_may(room: str) -> None:
    problems = {path.name: found for path in sorted((UI / room).glob("*.py"))
                if (found := layering_problems(room, path.read_text()))}
    assert not problems, problems


@pytest.mark.parametrize("path", ENTRY_POINTS, ids=lambda p: p.name)
def test_pages_and_the_app_name_ui_only_through_a_rooms_public_names(path: Path) -> None:
    assert not entry_point_problems(path.read_text())


@pytest.mark.parametrize("room", ["controllers", "domain", "notebook", "server", "session", "views", "widgets"])
def test_every_public_name_a_room_lists_exists(room: str) -> None:
    package = importlib.import_module(f"ui.{room}")
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert not missing
    modules = {p.stem for p in (UI / room).glob("*.py")} - {"__init__"}
    assert set(package.__all__) >= modules


def test_a_name_that_is_also_a_modules_is_refused() -> None:
    """`from ui.server import measurement_board` must not give the module where a page meant a
    function of the same name."""
    from ui import room_exports

    with pytest.raises(ValueError, match="board both as a module and as a name"):
        room_exports("ui.server", {"board": (), "measurements": ("board",)})


def test_the_checks_catch_a_planted_violation() -> None:
    """The checks above read what they should: each kind of violation, planted, is found."""
    assert layering_problems("controllers", "import streamlit as st")
    assert layering_problems("views", "def f():\n    from ui.controllers import lesson")
    assert layering_problems("views", "from ui.widgets.theme import current_theme")
    assert not layering_problems("widgets", "import streamlit as st\nfrom ui.views import charts")
    assert entry_point_problems("from ui.controllers.sampler_lab import COLUMNS")
    assert not entry_point_problems("from ui.controllers import sampler_lab as lab")


def test_the_app_never_loads_the_notebook_form() -> None:
    """The notebook room (anywidget, IPython's formatters) is for notebooks: no page, no other room
    and no engine module imports it, so it adds nothing to the app's start-up."""
    sources = [*ENTRY_POINTS, *(p for p in UI.rglob("*.py") if "notebook" not in p.parts),
               *(ROOT / "engine").rglob("*.py")]
    importers = [p.relative_to(ROOT).as_posix() for p in sources
                 if any(m.startswith("ui.notebook") or m == "anywidget" for m in imported_modules(p.read_text()))]
    assert importers == []
