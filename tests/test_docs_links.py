"""The user docs hold together: every relative link in README.md and docs/*.md names a file in the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text: str) -> list[str]:
    """The targets of `[text](target)` links that point into the tree (no scheme, no bare #anchor)."""
    targets = (m.group(1) for m in LINK.finditer(text))
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def test_the_link_pattern_finds_relative_targets_only():
    text = "[a](docs/x.md) [b](https://e.org) [c](#top) [d](../y.md#part) [e](mailto:a@b.c)"
    assert relative_links(text) == ["docs/x.md", "../y.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page.read_text()) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to missing files: {missing}"
