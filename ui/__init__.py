"""Streamlit view pieces shared by the pages. The engine does the work; this package shows it.

The app's server runs the model beside the visitors' browsers, on machines with few cores.
torch's OpenMP threads normally spin for a while after each parallel region, holding a core the
server's event loop and a local browser need, so a decode step inside the server during a Step
click took far longer than the same step alone. Told to sleep instead ("passive"), they give
most of that back and cost little alone (measured by `bench.ui_bench`; the figures are in
docs/benchmarks.md). OpenMP reads this once, when torch loads; app.py
imports this package before anything imports torch. (A server whose first visitor opens a page's
own link runs that page, which loads torch first: `make run` sets the variable itself.) An
explicit setting is left alone, and none is made once torch has loaded: the exact rows kernel
reads the variable to know whether OpenMP's threads sleep (engine/fast/exact_rows_kernel.cpp), so
it must say what OpenMP read.
"""

import os
import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def room_exports(package: str, exports: dict[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], list[str]]:
    """A room's `__getattr__` and `__all__`: its modules and the public names listed for each,
    imported from their module when first asked for (`from ui.views import PANEL_CSS`).

    A room's package does not import its modules up front: rooms use each other's modules (the
    session's settings read the server's deployment, the server's model keeps its choice in the
    session's keys), so packages that each imported all of their modules at once would import
    each other in a circle. Inside ui/, modules import the module that defines a name.
    """
    home = {name: module for module, names in exports.items() for name in names}
    if clashes := sorted(set(exports) & set(home)):  # `from ui.room import x` would give the module
        raise ValueError(f"{package} lists {', '.join(clashes)} both as a module and as a name")

    def __getattr__(name: str) -> Any:
        if name in exports:
            return import_module(f"{package}.{name}")
        if name in home:
            return getattr(import_module(f"{package}.{home[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__, sorted({*exports, *home})


# the C allocator's thresholds and heaps, once per process (ui/server/allocator.py says why); last, as
# ui.server's package imports room_exports from here
import_module("ui.server.allocator").settle_allocator()
