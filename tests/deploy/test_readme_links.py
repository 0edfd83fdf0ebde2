"""The README's links into the docs site land: MkDocs' strict build (`make docs`) checks the
links between the docs' own pages, but not the README's, which GitHub shows first."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub and MkDocs' toc give a page's headings (lower case, punctuation
    dropped, spaces to hyphens)."""
    titles = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"\s+", "-", re.sub(r"[^\w\- ]", "", title.strip().lower())) for title in titles}


def test_every_relative_link_in_the_readme_reaches_a_file_and_its_heading() -> None:
    links = [link for link in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
             if not link.startswith(("http://", "https://"))]
    assert any(link.startswith("docs/") for link in links)  # the README does point into the site
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.is_file() or (anchor and anchor not in heading_anchors(target)):
            broken.append(link)
    assert broken == []


def test_heading_anchors_follow_the_slug_rule() -> None:
    page = ROOT / "docs" / "serving.md"
    assert "without-make-plain-pip" in heading_anchors(page)  # "### Without make (plain pip)"
    assert "how-a-packed-pass-multiplies-tbt_batching" in heading_anchors(page)
