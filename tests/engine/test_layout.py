"""The engine's layout: imports run one way, and a notebook user who never batches loads none of
the server's machinery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_imports() -> dict[str, set[str]]:
    """Every engine module and the engine modules it imports, type-only and function-level
    imports included: `from engine.x import y` names engine.x (or engine.x.y where that is a
    module), `from engine import y` names the package unless y is a module of it."""
    modules = {module_name(path): path for path in ENGINE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name.split(".")[0] == "engine"}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "engine":
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.add(child if child in modules else node.module)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as the path that closes it (depth-first search)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_the_engine_has_no_import_circles() -> None:
    graph = engine_imports()
    assert "engine.serving.scheduler" in graph and "engine.speculative.rule" in graph  # the graph was read
    assert cycles(graph) == []


def test_the_loop_never_imports_the_server_or_speculative_decoding() -> None:
    """The top of engine/ is the loop and its stages: only the package's own front door (and the
    CLI, which offers every method) may reach into the sub-packages."""
    allowed = {"engine", "engine.cli", "engine.__main__"}
    loop = {module_name(path) for path in ENGINE.glob("*.py")} - allowed
    graph = engine_imports()
    for name, targets in graph.items():
        if name in loop:
            assert not {t for t in targets if t.startswith(("engine.serving", "engine.speculative"))}, name
    speculative = {name: targets for name, targets in graph.items() if name.startswith("engine.speculative")}
    assert all(not t.startswith("engine.serving") for targets in speculative.values() for t in targets)


def test_a_circle_is_found_where_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


# One fresh interpreter for every check that needs one (each start imports torch and transformers):
# what `import engine` leaves out, then every engine module imported without Streamlit.
IMPORT_ENGINE = """
import importlib, pkgutil, sys
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
import engine
from engine import Generation, SpeculativeGeneration, load_model
loaded = sorted(m for m in sys.modules if m.startswith("engine.serving"))
assert not loaded, loaded
assert "token_by_token_packed" not in ALL_ATTENTION_FUNCTIONS.valid_keys()
assert "token_by_token_inside" not in ALL_ATTENTION_FUNCTIONS.valid_keys()
assert not hasattr(torch.ops.token_by_token, "lone_rows_linear")
import engine.serving
assert "token_by_token_packed" not in ALL_ATTENTION_FUNCTIONS.valid_keys()  # importing registers nothing
names = [m.name for m in pkgutil.iter_modules(engine.__path__, "engine.")]
for name in names:
    importlib.import_module(name)
print("ok", len(names), "streamlit" in sys.modules)
"""


def test_importing_the_engine_loads_none_of_the_servers_machinery_registers_nothing_and_no_streamlit() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORT_ENGINE], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    ok, count, streamlit = result.stdout.split()
    assert ok == "ok" and int(count) >= 10 and streamlit == "False"


def test_the_first_scheduler_made_registers_the_packed_attention(tiny_lm) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from engine.serving import ForwardScheduler

    scheduler = ForwardScheduler(tiny_lm)
    try:
        assert "token_by_token_packed" in ALL_ATTENTION_FUNCTIONS.valid_keys()
    finally:
        scheduler.close()


def test_the_pages_import_only_the_engines_public_surface() -> None:
    """ui/, pages/ and app.py import `engine`, `engine.serving`, `engine.speculative` and the
    measurements of `engine.speed`, never a module inside them."""
    public = {"engine", "engine.serving", "engine.speculative", "engine.speed"}
    for path in [ROOT / "app.py", *(ROOT / "ui").rglob("*.py"), *(ROOT / "pages").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engine"):
                assert node.module in public, f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert all(not a.name.startswith("engine") or a.name in public for a in node.names), path.name


FAST_FRONT_DOOR_USERS = ["engine", "ui", "pages", "bench", "classroom", "training"]


def fast_submodule_imports(path: Path) -> list[str]:
    """The engine/fast modules `path` names directly: `engine.fast.x` (however imported), or a
    module of the package taken through `from engine.fast import x`."""
    submodules = {p.stem for p in (ENGINE / "fast").glob("*.py")} - {"__init__"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("engine.fast.")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("engine.fast."):
                found.append(node.module)
            elif node.module == "engine.fast":
                found += [f"engine.fast.{a.name}" for a in node.names if a.name in submodules]
    return found


def test_outside_engine_fast_every_module_comes_through_its_front_door() -> None:
    """engine/, ui/, pages/, bench/, classroom/, training/ and app.py import `from engine.fast
    import name`, never a module inside engine/fast: what the rest of the project uses is the
    package's __init__, so its files can move without a hunt."""
    paths = [ROOT / "app.py", *(path for folder in FAST_FRONT_DOOR_USERS for path in (ROOT / folder).rglob("*.py"))]
    inside = ENGINE / "fast"
    reaching_in = {str(path.relative_to(ROOT)): names for path in paths
                   if inside not in path.parents and (names := fast_submodule_imports(path))}
    assert len(paths) > 50  # the folders were read
    assert reaching_in == {}


def test_a_module_reaching_into_engine_fast_is_found(tmp_path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import engine.fast.lone\nfrom engine.fast.scripted_llama import LayerParts\n"
                      "from engine.fast import exact_rows_kernel, lone_step\n")
    assert fast_submodule_imports(sample) == ["engine.fast.lone", "engine.fast.scripted_llama",
                                              "engine.fast.exact_rows_kernel"]


def test_every_name_at_engine_fasts_front_door_resolves() -> None:
    import engine.fast

    assert all(getattr(engine.fast, name) is not None for name in engine.fast.__all__)
    assert {"proof_decisions", "Proof", "lone_step", "LayerParts", "plain_filled"} <= set(engine.fast.__all__)
    assert engine.proof_decisions is engine.fast.proof_decisions  # the pages read it from `engine`
