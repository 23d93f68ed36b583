"""The demo corpus: Python standard-library source files, split by module unit.

A *unit* is the top-level package of a module (``email.mime.text`` -> ``email``), except inside the
``test`` and ``idlelib`` packages, whose second level is the unit (``test.test_asyncio.test_tasks`` ->
``test.test_asyncio``), so that the big test suite can spread over parts. A unit's part is decided by
the SHA-256 of its name alone, so the split is the same on every machine and Python version and a unit
never straddles two parts.

Parts: ``train`` (language-model training), ``router`` (router training, unseen by the models) and
``eval`` (held out from everything, for ``tokenrouter eval``).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

PARTS = ("train", "router", "eval")
# Directories that hold no ordinary Python source (vendored packages, generated tables, plain-text data).
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data", "lib2to3"})
MAX_FILE_BYTES = 200_000  # a few generated files (large literal tables) are not code worth learning


@dataclass(slots=True)
class SplitConfig:
    """Shares of units per part, in percent; they must sum to 100."""

    train_pct: int = 80
    router_pct: int = 10
    eval_pct: int = 10

    def __post_init__(self) -> None:
        for name in ("train_pct", "router_pct", "eval_pct"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.train_pct + self.router_pct + self.eval_pct != 100:
            raise ValueError("train_pct + router_pct + eval_pct must be 100")


@dataclass(slots=True)
class SourceFile:
    module: str  # dotted module name, e.g. "email.mime.text"
    path: Path

    @property
    def unit(self) -> str:
        return module_unit(self.module)


def module_unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] in ("test", "idlelib") and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def part_of(module: str, cfg: SplitConfig | None = None) -> str:
    """The part ("train", "router" or "eval") a module belongs to, from its unit's name alone."""
    cfg = cfg or SplitConfig()
    bucket = int.from_bytes(hashlib.sha256(module_unit(module).encode()).digest()[:8], "big") % 100
    if bucket < cfg.train_pct:
        return "train"
    if bucket < cfg.train_pct + cfg.router_pct:
        return "router"
    return "eval"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def find_sources(root: Path | None = None) -> list[SourceFile]:
    """Every ``.py`` file under the standard library (or ``root``), sorted by module name."""
    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise ValueError(f"source folder {root} does not exist")
    found: list[SourceFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in filenames:
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1] or ["__init__"]
            found.append(SourceFile(".".join(parts), path))
    found.sort(key=lambda s: s.module)
    return found


def read_text(path: Path) -> str | None:
    """The file's text, or None for a file that is not valid UTF-8 (a few tests ship such files)."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def split_sources(sources: list[SourceFile], cfg: SplitConfig | None = None) -> dict[str, list[SourceFile]]:
    out: dict[str, list[SourceFile]] = {p: [] for p in PARTS}
    for s in sources:
        out[part_of(s.module, cfg)].append(s)
    return out


def export_texts(files: list[SourceFile], dest: Path) -> int:
    """Write each file as ``<module>.py`` into ``dest`` (a flat folder of text files); returns the count."""
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    for s in files:
        text = read_text(s.path)
        if text is None or not text.strip():
            continue
        (dest / f"{s.module}.py").write_text(text, encoding="utf-8")
        n += 1
    return n


def read_text_dir(folder: Path) -> list[tuple[str, str]]:
    """(name, text) of every regular text file in ``folder``, sorted by name. Raises ValueError if none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"data folder {folder} does not exist or is not a folder")
    out = []
    for p in sorted(folder.iterdir()):
        if p.is_file():
            text = read_text(p)
            if text and text.strip():
                out.append((p.name, text))
    if not out:
        raise ValueError(f"data folder {folder} holds no readable text files")
    return out
