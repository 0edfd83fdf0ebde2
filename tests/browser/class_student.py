"""What the class tests wait for on a student's page."""

from __future__ import annotations

from playwright.sync_api import Locator, Page

GUESS_LABEL = "Or type your guess for the next token"

# Exactly one guess field, and the reveal of step `steps` drawn below it. Each step's field has
# a key of its own (ui/controllers/class_room.py guess_keys); Streamlit keeps the field a run
# replaces on the page, just after the new one, until that run ends, and a strict locator fails
# at once on the two. The count of tokens shown (the follow view) changes before the run that
# draws the step's own field; the reveal below the field comes from that run alone.
_FIELD_DRAWN = """([label, steps]) => {
    const fields = document.querySelectorAll(`input[aria-label^="${label}"]`);
    const titles = [...document.querySelectorAll('.tbt-class-reveal .tbt-title')].map((t) => t.textContent);
    return fields.length === 1 && (steps === 0 || titles.some((t) => t.startsWith(`Step ${steps} revealed`)));
}"""


def guess_field(page: Page, steps: int, timeout: float = 30_000) -> Locator:
    """The student's guess field for the token after step `steps`, once the run that drew it is over."""
    page.wait_for_function(_FIELD_DRAWN, arg=[GUESS_LABEL, steps], timeout=timeout)
    return page.get_by_label(GUESS_LABEL)

