"""axe-core's audit of a page (or a frame, or a part of one) as the browser tests read it."""

from __future__ import annotations

from collections.abc import Collection

from axe_playwright_python.sync_playwright import Axe

BLOCKING = {"serious", "critical"}


def serious_violations(target, context: str | None = None, also: Collection[str] = ()) -> list[str]:
    """What axe finds serious or critical in `target` (a page or a frame; within the CSS selector
    `context`, if given), and any finding of the rules in `also` however axe rates it: one line
    each, the rule, its rating and its first node."""
    violations = Axe().run(target, context=context).response["violations"]
    return [f"{v['id']} ({v['impact']}): {v['nodes'][0]['html'][:160]}" for v in violations
            if v["impact"] in BLOCKING or v["id"] in also]
