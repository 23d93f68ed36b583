"""The grammar and the parser: every LANGUAGE.md form parses into the AST it means."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokenrouter.dsl import ast
from tokenrouter.dsl.parser import lark_parser, parse

LANGUAGE_EXAMPLE = """
# citer.tr — the small model writes; tokens its router doubts go to the large model.
policy citer "CITER-style token routing between Qwen3-0.6B and Qwen3-32B"

param slm_path: str = "Qwen/Qwen3-0.6B"
param llm_path: str = "Qwen/Qwen3-32B"
param gate_path: str = "citer_gate.safetensors"
param threshold: float = 0.7

model slm = slm_path { gpu: 0, batch: auto }
model llm = llm_path { gpu: 1, batch: auto }

router gate = mlp(gate_path, hidden(slm))

serve { concurrency: 8, max_delay_ms: 5 }

entry slm

route slm {
  when sigmoid(gate) > threshold -> llm drop   # the LLM rewrites this position
}

route llm {
  -> slm                                       # one LLM token, then back
}
"""


def ok(text: str) -> ast.Module:
    result = parse(text, "t.tr")
    assert result.diagnostics == [], [d.render() for d in result.diagnostics]
    assert result.module is not None
    return result.module


def expr(text: str) -> ast.Expr:
    module = ok(f"param x: bool = {text}")
    decl = module.decls[0]
    assert isinstance(decl, ast.ParamDecl)
    return decl.value


def test_grammar_is_conflict_free_under_strict_lalr() -> None:
    parser = lark_parser(strict=True)
    assert parser.options.parser == "lalr"


def test_language_md_example_parses() -> None:
    module = ok(LANGUAGE_EXAMPLE)
    kinds = [type(d).__name__ for d in module.decls]
    assert kinds == ["PolicyDecl"] + ["ParamDecl"] * 4 + ["ModelDecl"] * 2 + ["RouterDecl", "ServeDecl",
                     "EntryDecl", "RouteDecl", "RouteDecl"]  # fmt: skip
    route = module.decls[-2]
    assert isinstance(route, ast.RouteDecl)
    rule = route.rules[0]
    assert rule.drop and rule.for_k is None and rule.target.name == "llm"
    assert rule.cond == ast.Binary(
        ">", ast.Call(ast.Name(("sigmoid",)), (ast.Name(("gate",)),)), ast.Name(("threshold",))
    )


def test_the_language_md_file_example_parses_too() -> None:
    doc = Path("/work/shared/LANGUAGE.md")
    if not doc.exists():
        pytest.skip("LANGUAGE.md not at hand")
    block = re.search(r"## A complete example\n\n```\n(.*?)```", doc.read_text(), re.S)
    assert block is not None
    ok(block.group(1))


def test_positions_are_one_based_and_span_the_token() -> None:
    module = ok('policy p\nmodel   small = "x"\n')
    m = module.decls[1]
    assert isinstance(m, ast.ModelDecl)
    assert (m.name.span.line, m.name.span.col, m.name.span.end_col) == (2, 9, 14)
    assert m.span.line == 2 and m.span.col == 1


@pytest.mark.parametrize(
    ("text", "tree"),
    [
        ("1 + 2 * 3", ast.Binary("+", ast.Number(1), ast.Binary("*", ast.Number(2), ast.Number(3)))),
        ("1 - 2 - 3", ast.Binary("-", ast.Binary("-", ast.Number(1), ast.Number(2)), ast.Number(3))),
        ("not a and b", ast.Binary("and", ast.Unary("not", ast.Name(("a",))), ast.Name(("b",)))),
        (
            "a or b and c",
            ast.Binary("or", ast.Name(("a",)), ast.Binary("and", ast.Name(("b",)), ast.Name(("c",)))),
        ),
        ("-x < 1e-3", ast.Binary("<", ast.Unary("-", ast.Name(("x",))), ast.Number(1e-3))),
        ("token in [1, 2]", ast.In(ast.Name(("token",)), ast.ListExpr((ast.Number(1), ast.Number(2))))),
        ("m.low(0.5)", ast.Call(ast.Name(("m", "low")), (ast.Number(0.5),))),
        ("uniform() < 0.5", ast.Binary("<", ast.Call(ast.Name(("uniform",)), ()), ast.Number(0.5))),
        ("(true)", ast.Bool(True)),
        ('"a\\"b\\\\"', ast.String('a"b\\')),
    ],
)
def test_expression_forms(text: str, tree: ast.Expr) -> None:
    assert expr(text) == tree


def test_numbers_keep_int_and_float_apart() -> None:
    assert expr("8") == ast.Number(8) and isinstance(expr("8").value, int)
    assert isinstance(expr("0.7").value, float)
    assert expr("1e-3").value == pytest.approx(0.001)


def test_every_declaration_form() -> None:
    module = ok(
        """policy p "d"
        import "lib.tr" as lib
        import stdlib.citer
        param k: int = 2
        model a = "x" { gpus: [0, 1], batch: 4, mem: 0.5, dtype: "float16", max_len: 4096, engine: "sglang", load: "dummy" }
        model b = "y"
        router r = linear("r.safetensors", hidden(a), topk_logits(a, 10), topk_logprobs(a, 5), embedding(a, token))
        fn f(x: float, y: int) = x * y
        serve { concurrency: 4, max_delay_ms: 2.5 }
        entry a
        route a { when f(margin, 2) > 1 -> b drop for k  -> b for 3 }
        route b { }
        """
    )
    imports = [d for d in module.decls if isinstance(d, ast.ImportDecl)]
    assert imports[0].path == "lib.tr" and imports[0].alias == ast.Ident("lib")
    assert imports[1].stdlib == "citer" and imports[1].alias is None
    route = [d for d in module.decls if isinstance(d, ast.RouteDecl)][0]
    assert route.rules[0].for_k == ast.Name(("k",)) and route.rules[0].drop
    assert route.rules[1].cond is None and route.rules[1].for_k == ast.Number(3) and not route.rules[1].drop
    model = [d for d in module.decls if isinstance(d, ast.ModelDecl)][0]
    assert [o.key.name for o in model.options or ()] == [
        "gpus",
        "batch",
        "mem",
        "dtype",
        "max_len",
        "engine",
        "load",
    ]


def test_batch_auto_is_an_auto_node() -> None:
    module = ok('model a = "x" { batch: auto }')
    model = module.decls[0]
    assert isinstance(model, ast.ModelDecl) and model.options is not None
    assert model.options[0].value == ast.Auto()


def test_comments_are_kept_for_the_formatter_and_strings_are_not_comments() -> None:
    module = ok('policy p "a # not a comment"  # a comment\n# another\n')
    assert [c.text for c in module.comments] == ["# a comment", "# another"]
    assert module.decls[0] == ast.PolicyDecl(ast.Ident("p"), "a # not a comment")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("param a int = 1", "unexpected 'int'; expected ':'"),
        ("param a: bool = 1 < 2 < 3", "comparisons cannot be chained"),
        ('model a = "x" { gpu: 0 batch: 1 }', "options are separated by commas"),
        ("param a: bool = x = 1", "use '==' to compare"),
        ("param when: int = 1", "'when' is a keyword and cannot be used as a name"),
        ('param s: str = "abc', "unterminated string"),
        ("param a: bool = x && y", "write 'and'"),
        ("route a {", "unexpected end of file"),
        ('param s: str = "\\n"', "unknown escape"),
        ("import other.x", "unknown import root 'other'"),
    ],
)
def test_friendly_syntax_messages(text: str, message: str) -> None:
    result = parse(text, "t.tr")
    assert result.module is None
    assert any(message in d.message for d in result.diagnostics), [d.message for d in result.diagnostics]


def test_recovery_reports_each_broken_declaration() -> None:
    result = parse("policy p\nparam a int = 1\nmodel m = \nparam ok: int = 1\nentry 3\n", "t.tr")
    assert [d.line for d in result.diagnostics] == [2, 4, 5]


def test_render_has_header_source_line_and_caret() -> None:
    d = parse("policy p\nparam a int = 1\n", "t.tr").diagnostics[0]
    assert d.render() == "t.tr:2:9: error: unexpected 'int'; expected ':'\nparam a int = 1\n        ^~~"


@pytest.mark.parametrize("body", ["+".join(["1"] * 3000), "not " * 3000 + "true", "-" * 3000 + "1"])
def test_absurd_nesting_is_a_diagnostic_not_a_recursion_error(body: str) -> None:
    from tokenrouter.compiler.driver import compile_source

    result = compile_source(f"policy p\nparam x: int = {body}\n", "deep.tr")
    assert result.plan is None
    assert any("nested more than" in d.message for d in result.diagnostics)
