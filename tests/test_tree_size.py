"""What every clone and every GPU call carries stays small: the tracked tree under 48 MiB (a GPU call carries at
most 64 MiB, the tree included), docs/ under 250 KB of text and 2 MB on disk, a README of at most 100 lines."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def test_the_tracked_tree_is_under_48_mib():
    total = sum(p.stat().st_size for p in tracked_files())
    print(f"tracked tree: {total / 2**20:.1f} MiB")
    assert total < 48 * 2**20


def test_docs_are_small_and_the_readme_short():
    docs = [p for p in (ROOT / "docs").rglob("*") if p.is_file()]
    text = sum(p.stat().st_size for p in docs if p.suffix == ".md")
    print(f"docs: {text / 1000:.0f} KB of text, {sum(p.stat().st_size for p in docs) / 1e6:.2f} MB on disk")
    assert text < 250_000 and sum(p.stat().st_size for p in docs) < 2_000_000
    assert len((ROOT / "README.md").read_text().splitlines()) <= 100


def test_no_table_row_in_the_readme_or_docs_is_over_215_characters():
    long_rows = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if line.startswith("|") and len(line) > 215
    ]
    assert not long_rows
