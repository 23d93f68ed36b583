"""The formatter: idempotent, and the parse of its output equals the parse of its input."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.dsl.formatter import LINE_LENGTH, format_expr, format_module
from tokenrouter.dsl.parser import parse

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    [
        *REPO.glob("tokenrouter/stdlib/*.tr"),
        *REPO.glob("examples/*.tr"),
        *REPO.glob("tests/fixtures/formatter/*.tr"),
    ]
)


def parsed(text: str):
    result = parse(text, "t.tr")
    assert result.module is not None, [d.render() for d in result.diagnostics]
    return result.module


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_round_trip(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    once = format_module(parsed(text))
    assert format_module(parsed(once)) == once  # idempotent
    assert parsed(once) == parsed(text)  # same AST, positions aside
    comments = [
        line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line and '"' not in line
    ]
    for c in comments:
        assert c in once  # comments survive


def test_shipped_files_are_already_formatted() -> None:
    for path in [*REPO.glob("tokenrouter/stdlib/*.tr"), *REPO.glob("examples/*.tr")]:
        text = path.read_text(encoding="utf-8")
        assert format_module(parsed(text)) == text, f"run `tokenrouter fmt {path}`"


@pytest.mark.parametrize(
    ("src", "canonical"),
    [
        ("(1 + 2) * 3", "(1 + 2) * 3"),
        ("1 + (2 * 3)", "1 + 2 * 3"),
        ("1 - (2 - 3)", "1 - (2 - 3)"),
        ("(1 - 2) - 3", "1 - 2 - 3"),
        ("not (a and b)", "not (a and b)"),
        ("(not a) and b", "not a and b"),
        ("-(a + b)", "-(a + b)"),
        ("(a < b) == c", "(a < b) == c"),
        ("a or (b or c)", "a or (b or c)"),
        ("x in [1,2 ,3]", "x in [1, 2, 3]"),
        ('"q\\"\\\\"', '"q\\"\\\\"'),
    ],
)
def test_minimal_parentheses(src: str, canonical: str) -> None:
    module = parsed(f"param x: bool = {src}")
    assert format_expr(module.decls[0].value) == canonical


def test_layout_and_comment_placement() -> None:
    src = (
        '# top\npolicy p   # why\n\n\n\nmodel a="x"{gpu:0,batch:auto,}\nroute a{\n# lead\nwhen margin<0.1->b drop for 2 # tail\n'
        "-> b\n# last\n}\n# end\n"
    )
    assert format_module(parsed(src)) == (
        '# top\npolicy p  # why\n\nmodel a = "x" { gpu: 0, batch: auto }\nroute a {\n  # lead\n'
        "  when margin < 0.1 -> b drop for 2  # tail\n  -> b\n  # last\n}\n# end\n"
    )


def test_a_long_declaration_is_broken_at_argument_boundaries() -> None:
    """A two-line router declaration stays two lines within LINE_LENGTH (it was joined into one of 150
    columns), broken as its source was; model and serve options that do not fit break the same way."""
    src = (
        "policy p\n"
        'model slm = "s" { batch: auto, gpu: 0, mem: 0.5, dtype: "bfloat16", max_len: 4096, engine: "embedded",'
        ' load: "dummy" }\n'
        'router gate = mlp("routers/a_rather_long_router_file_name_for_the_gate.safetensors", hidden(slm),\n'
        "                  topk_logprobs(slm, 100), embedding(slm, token))  # the gate\n"
        "entry slm\n"
    )
    out = format_module(parsed(src))
    assert out == (
        "policy p\n"
        'model slm = "s" { batch: auto, gpu: 0, mem: 0.5, dtype: "bfloat16", max_len: 4096,\n'
        '                  engine: "embedded", load: "dummy" }\n'
        'router gate = mlp("routers/a_rather_long_router_file_name_for_the_gate.safetensors", hidden(slm),\n'
        "                  topk_logprobs(slm, 100), embedding(slm, token))  # the gate\n"
        "entry slm\n"
    )
    assert all(len(line.split("  #")[0]) <= LINE_LENGTH for line in out.splitlines())
    assert format_module(parsed(out)) == out and parsed(out) == parsed(src)
    one_line = src.replace(",\n                  topk", ", topk")
    assert format_module(parsed(one_line)) == out
