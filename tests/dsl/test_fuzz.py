"""Mutated sources (characters and tokens deleted, inserted, swapped) only ever produce diagnostics —
never an exception — through the whole pipeline: parse, every pass, lowering, the plan check, fmt."""

from __future__ import annotations

import importlib.util
import random
import re
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrouter.compiler.driver import compile_source
from tokenrouter.compiler.plan import validate_plan
from tokenrouter.dsl.diagnostics import Diagnostic
from tokenrouter.dsl.formatter import format_module
from tokenrouter.dsl.parser import parse

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted([*REPO.glob("tokenrouter/stdlib/*.tr"), *REPO.glob("examples/*.tr"),
                  *REPO.glob("tests/fixtures/formatter/*.tr")])  # fmt: skip
TEXTS = [(str(p), p.read_text(encoding="utf-8")) for p in SOURCES]
VOCAB = ["policy", "param", "model", "router", "fn", "route", "entry", "serve", "import", "when", "->", "drop",
         "for", "and", "or", "not", "in", "auto", "true", "{", "}", "(", ")", "[", "]", ",", ":", "=", "==", "<",
         "-", "/", "0", "-1", "1e309", "0.5", '"', '"x"', "#", "\n", "a", "slm", "llm", "token", "uniform()",
         "stdlib.citer", "x.y", "\\", "é", "\t"]  # fmt: skip
TOKEN = re.compile(r"\s+|\w+|->|==|<=|>=|!=|.", re.S)


def mutate(text: str, ops: list[tuple[int, int, int, int]]) -> str:
    tokens = TOKEN.findall(text)
    for kind, i, j, v in ops:
        if not tokens:
            tokens = [VOCAB[v % len(VOCAB)]]
        i %= len(tokens)
        j %= len(tokens)
        if kind == 0:
            del tokens[i]
        elif kind == 1:
            tokens.insert(i, VOCAB[v % len(VOCAB)])
        elif kind == 2:
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif kind == 3:  # a single character
            s = "".join(tokens)
            pos = i % (len(s) + 1)
            tokens = TOKEN.findall(s[:pos] + VOCAB[v % len(VOCAB)][:1] + s[pos + 1 :])
        else:
            tokens.insert(i, " ")
    return "".join(tokens)


def run_pipeline(file: str, text: str) -> None:
    result = compile_source(text, file)
    assert all(isinstance(d, Diagnostic) for d in result.diagnostics)
    for d in result.diagnostics:
        d.render()
    if result.plan is not None:
        assert not result.errors
        validate_plan(result.plan, file)
    else:
        assert result.errors
    parsed = parse(text, file)
    if parsed.module is not None:
        assert parse(format_module(parsed.module), file).module == parsed.module


ops = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 1000)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=st.sampled_from(TEXTS), ops=ops)
def test_mutated_sources_only_yield_diagnostics(source: tuple[str, str], ops) -> None:
    file, text = source
    run_pipeline(file, mutate(text, ops))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=80))
def test_arbitrary_text_only_yields_diagnostics(text: str) -> None:
    run_pipeline("fuzz.tr", text)


def _fuzz_check():
    """bench/fuzz_check.py (the larger campaign) as a module."""
    spec = importlib.util.spec_from_file_location("fuzz_check", REPO / "bench" / "fuzz_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_seeded_campaign_through_check_and_inspect_has_no_traceback(tmp_path: Path) -> None:
    """A few hundred mutated policies through `check`'s code path in-process (typer's runner), the hand-made
    hostile policies of issue 57 (but the slow large files), hand-edited plans through `inspect`, and a sample
    through the real command line: no traceback, and every exit code 0, 1 or 2."""
    fuzz = _fuzz_check()
    root = fuzz.workdir(tmp_path)
    rng = random.Random(57)
    texts = [p.read_text(encoding="utf-8") for p in fuzz.SEEDS]
    mutated = []
    for i in range(300):
        mutated.append(root / f"m{i}.tr")
        mutated[-1].write_bytes(fuzz.mutate(rng.choice(texts), rng))
    hostile = [p for p in fuzz.hostile_policies(root) if not p.name.startswith("large_")]
    plans = fuzz.hostile_plans(root, 40, rng)
    results = {
        "mutated": fuzz.run_all(mutated, fuzz.in_process("check"), fuzz.Tally()),
        "hostile": fuzz.run_all(hostile, fuzz.in_process("check"), fuzz.Tally()),
        "plans": fuzz.run_all(plans, fuzz.in_process("inspect"), fuzz.Tally()),
        "cli": fuzz.cli("check", rng.sample(mutated, 10), fuzz.Tally()),
    }
    for name, tally in results.items():
        assert not tally.tracebacks, f"{name}: {tally.tracebacks[0][0].name}\n{tally.tracebacks[0][1]}"
        assert set(tally.codes) <= {0, 1, 2}, (name, tally.codes)
    assert results["hostile"].codes == {0: 1, 1: len(hostile) - 1}  # all refused but the import bomb
