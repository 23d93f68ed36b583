"""A tiny prepared corpus and a tiny trained pair, built once per test session (~20 s on 2 cores)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tokenrouter.training.corpus import find_sources, stdlib_dir

REPO = Path(__file__).resolve().parents[2]
# a spread of small stdlib modules: enough units that every part of the split gets some
MODULES = ("abc", "bisect", "colorsys", "contextvars", "copy", "copyreg", "fnmatch", "functools", "genericpath",
           "getopt", "glob", "graphlib", "heapq", "keyword", "linecache", "numbers", "opcode", "operator",
           "queue", "reprlib", "sched", "shlex", "stat", "string", "textwrap", "this", "token", "types",
           "uu", "weakref", "json", "email", "html", "http", "wsgiref", "urllib", "xml", "zoneinfo")  # fmt: skip


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stdlib")
    wanted = set(MODULES)
    for s in find_sources(stdlib_dir()):
        if s.unit in wanted and s.path.stat().st_size < 40_000:
            dest = root / s.path.relative_to(stdlib_dir())
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(s.path, dest)
    return root


@pytest.fixture(scope="session")
def tiny_corpus(tiny_root, tmp_path_factory) -> Path:
    from tokenrouter.training.prepare import prepare

    out = tmp_path_factory.mktemp("corpus")
    prepare(out, root=tiny_root, vocab_size=400)
    return out


@pytest.fixture(scope="session")
def tiny_pair(tiny_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models")
    cmd = [sys.executable, str(REPO / "bench" / "train_models.py"), "--data", str(tiny_corpus), "--out", str(out),
           "--tiny", "--device", "cpu"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
