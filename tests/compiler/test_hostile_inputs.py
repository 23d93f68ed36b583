"""Hostile policies and hand-edited plans (issue 57): what `check` accepts the server can hold, and every bad
input is a located diagnostic or a `PlanError` naming the field, never a traceback."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenrouter.cli import app
from tokenrouter.compiler.driver import compile_file, compile_source
from tokenrouter.compiler.plan import PlanError, validate_plan

REPO = Path(__file__).resolve().parents[2]
BERNOULLI = REPO / "examples" / "bernoulli.tr"
runner = CliRunner()


def errors(text: str, file: Path = BERNOULLI, defines: dict[str, str] | None = None) -> list[str]:
    """`FILE:LINE:COL: error: MESSAGE` headers; none means the policy compiled (and its plan validates)."""
    result = compile_source(text, str(file), defines)
    if result.plan is not None:
        validate_plan(result.plan)
    return [d.header() for d in result.errors]


def check(*args: str):
    """`tokenrouter check ARGS` in-process: its exit code and output, and never an exception."""
    r = runner.invoke(app, ["check", *args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


def bernoulli(old: str, new: str) -> str:
    text = BERNOULLI.read_text(encoding="utf-8")
    assert old in text
    return text.replace(old, new)


# --- constants the route kernel cannot hold ----------------------------------------------------------------


def test_a_float_constant_beyond_float32_is_an_error_at_the_literal() -> None:
    assert errors(bernoulli("uniform() < p", "uniform() < 1e300")) == [
        f"{BERNOULLI}:18:20: error: 1e+300 is beyond the route kernel's float32 range (±3.4e38)"
    ]
    assert errors(bernoulli("uniform() < p", "uniform() < 3e38")) == []


def test_a_param_beyond_float32_is_an_error_where_a_rule_reads_it() -> None:
    for source, defines in ((bernoulli("p: float = 0.2", "p: float = 1e300"), None), (None, {"p": "1e300"})):
        text = source or BERNOULLI.read_text(encoding="utf-8")
        assert errors(text, defines=defines) == [
            f"{BERNOULLI}:18:20: error: param 'p': 1e+300 is beyond the route kernel's float32 range (±3.4e38)"
        ]


def test_infinite_literals_and_folded_overflows_are_located_errors() -> None:
    # `1e309` was accepted by check (a plan constant of inf) and refused by compile when it wrote the plan
    assert errors(bernoulli("uniform() < p", "uniform() < 1e309")) == [
        f"{BERNOULLI}:18:20: error: float literal 1e309 is beyond the float range (±1.8e308)"
    ]
    assert errors(bernoulli("p: float = 0.2", "p: float = 1e308 * 10")) == [
        f"{BERNOULLI}:5:18: error: out of range: inf is not a finite number"
    ]
    assert errors(bernoulli("slm_batch: int = 2", "slm_batch: int = 9223372036854775807 + 1")) == [
        f"{BERNOULLI}:7:24: error: out of range: 9223372036854775808 is beyond the 64-bit int range [-2^63, 2^63 - 1]"
    ]


def test_int_literals_beyond_64_bits_are_errors_even_past_pythons_digit_limit() -> None:
    assert errors(bernoulli("slm_batch: int = 2", "slm_batch: int = 18446744073709551616")) == [
        f"{BERNOULLI}:7:24: error: int literal 18446744073709551616 is beyond the 64-bit int range "
        "(at most 9223372036854775807)"
    ]
    for digits in (400, 5000):  # a float param, max_delay_ms; 5,000 is past `int`'s 4,300-digit limit
        for old, new in (("p: float = 0.2", "p: float = "), ("max_delay_ms: 5", "max_delay_ms: ")):
            (message,) = errors(bernoulli(old, new + "9" * digits))
            assert (
                f"int literal 999999999999…999999 ({digits} digits) is beyond the 64-bit int range" in message
            )


def test_defines_beyond_the_range_are_errors_naming_the_param() -> None:
    assert errors(BERNOULLI.read_text(encoding="utf-8"), defines={"slm_batch": "9" * 5000}) == [
        f"{BERNOULLI}: error: -D slm_batch=999999999999999999999999…99999999 (5000 characters): beyond the "
        "64-bit int range (param 'slm_batch' is int)"
    ]
    assert errors(BERNOULLI.read_text(encoding="utf-8"), defines={"slm_batch": "-9223372036854775809"}) != []


def test_check_and_compile_refuse_the_same_plans(tmp_path: Path) -> None:
    policy = tmp_path / "b.tr"
    policy.write_text(bernoulli("uniform() < p", "uniform() < 1e300"), encoding="utf-8")
    assert check(str(policy))[0] == 1
    r = runner.invoke(app, ["compile", str(policy), "-o", str(tmp_path / "b.plan")])
    assert r.exit_code == 1 and not (tmp_path / "b.plan").exists()


def test_a_hand_edited_plan_with_a_constant_beyond_the_kernel_is_refused() -> None:
    plan = compile_source(BERNOULLI.read_text(encoding="utf-8"), str(BERNOULLI)).plan
    assert plan is not None
    node = next(n for n in plan["routes"]["slm"]["nodes"] if n["op"] == "const")
    for value, message in (
        (1e300, "beyond the route kernel's float32 range"),
        (2**70, "expected a int (int64)"),
    ):
        node["value"], node["type"] = value, "float" if isinstance(value, float) else "int"
        with pytest.raises(PlanError, match=r"field routes\.slm\.nodes\[\d+\]\.value: ") as e:
            validate_plan(json.loads(json.dumps(plan)), "b.plan")
        assert message in str(e.value)


# --- paths, router files, encodings: a located diagnostic, not a traceback -----------------------------------


def model_path_errors(path: str, tmp_path: Path) -> list[str]:
    policy = tmp_path / "b.tr"
    policy.write_text(bernoulli('"models/py-small"', f'"{path}"'), encoding="utf-8")
    code, output = check(str(policy))
    assert code == 1
    return [line for line in output.splitlines() if ": error: " in line]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("a" * 5000, "model 'slm': path too long for this system (5000 characters)"),
        ("a\0b", "model 'slm': a path cannot contain a NUL byte"),
        ("~nosuchuser/m", "model 'slm': cannot expand '~nosuchuser': no such user"),
    ],
)
def test_a_model_path_no_file_can_have_is_a_located_error(path: str, message: str, tmp_path: Path) -> None:
    assert model_path_errors(path, tmp_path) == [f"{tmp_path / 'b.tr'}:10:13: error: {message}"]


def test_an_import_path_with_a_nul_byte_is_a_located_error(tmp_path: Path) -> None:
    policy = tmp_path / "b.tr"
    policy.write_text(bernoulli("param p", 'import "x\\u0000y.tr" as z\nparam p').replace("\\u0000", "\0"))
    code, output = check(str(policy))
    assert code == 1 and f"{policy}:5:1: error: cannot import " in output
    assert "a path cannot contain a NUL byte" in output


def router_policy(tmp_path: Path, header: bytes) -> Path:
    (tmp_path / "r.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    text = (REPO / "examples" / "r2r_kd.tr").read_text(encoding="utf-8")
    text = text.replace('"routers/py_kd_r2r_divergence.safetensors"', '"r.safetensors"')
    policy = tmp_path / "r.tr"
    policy.write_text(text.replace('"models/', f'"{REPO}/examples/models/'), encoding="utf-8")
    return policy


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (json.dumps({"weight": {"dtype": "F32", "shape": ["a", 2]}}).encode(), "bad entry for 'weight'"),
        (json.dumps({"weight": {"dtype": "F32", "shape": [None]}}).encode(), "bad entry for 'weight'"),
        (json.dumps({"weight": {"dtype": ["F32"], "shape": [1]}}).encode(), "bad entry for 'weight'"),
        (b"[" * 50_000 + b"]" * 50_000, "bad header"),
        (b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "bad header"),
        (json.dumps({"__metadata__": [1, 2]}).encode(), "__metadata__ is not an object of strings"),
    ],
)
def test_a_hostile_router_header_is_a_located_error(header: bytes, why: str, tmp_path: Path) -> None:
    policy = router_policy(tmp_path, header)
    code, output = check(str(policy))
    assert code == 1
    assert (
        f"{policy}:21:25: error: router 'divergence': " in output
        and f"not a safetensors file ({why})" in output
    )


def test_invalid_utf8_is_reported_at_its_line_and_column(tmp_path: Path) -> None:
    policy = tmp_path / "b.tr"
    policy.write_bytes(BERNOULLI.read_bytes().replace(b"entry slm", b"entry s\xc3l\xffm"))
    code, output = check(str(policy))
    assert code == 1
    assert f"{policy}:15:8: error: not UTF-8 text: byte 0xc3 (invalid continuation byte)" in output
    lib = tmp_path / "lib.tr"  # an imported file: the same message, at its own place
    lib.write_bytes(b"policy lib\nparam x: int = 1 # \xff\n")
    policy.write_text(bernoulli("param p", 'import "lib.tr"\nparam p'), encoding="utf-8")
    code, output = check(str(policy))
    assert code == 1 and f"{lib}:2:20: error: not UTF-8 text: byte 0xff (invalid start byte)" in output


# --- hand-edited plans through `inspect` -----------------------------------------------------------------------


def inspect(tmp_path: Path, edit) -> str:
    plan = compile_source(BERNOULLI.read_text(encoding="utf-8"), str(BERNOULLI)).plan
    assert plan is not None
    text = edit(plan)
    (tmp_path / "x.plan").write_text(text if isinstance(text, str) else json.dumps(plan), encoding="utf-8")
    r = runner.invoke(app, ["inspect", str(tmp_path / "x.plan")])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code == 1
    return r.output.strip()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("a" * 5000, "path too long for this system (5000 characters)"),
        ("a\0b", "a path cannot contain a NUL byte"),
        ("~nosuchuser/m", "cannot expand '~nosuchuser': no such user"),
    ],
)
def test_inspect_names_a_bad_path_field(path: str, message: str, tmp_path: Path) -> None:
    out = inspect(tmp_path, lambda plan: plan["models"]["llm"].__setitem__("path", path))
    assert out == f"error: {tmp_path / 'x.plan'}: field models.llm.path: {message}"


def test_inspect_refuses_json_nested_too_deep(tmp_path: Path) -> None:
    out = inspect(tmp_path, lambda plan: "[" * 100_000 + "]" * 100_000)
    assert out == f"error: {tmp_path / 'x.plan'}: not a plan: its JSON is nested too deep"


@pytest.mark.parametrize(
    ("tuning", "field", "message"),
    [
        ({"warnings": 5}, "tuning.warnings", "expected a list of strings"),
        ({"warnings": "abc"}, "tuning.warnings", "expected a list of strings"),
        ({"auto": 5}, "tuning.auto", "expected a list of the plan's models"),
        ([], "tuning", "expected an object"),
    ],
)
def test_inspect_names_a_bad_tuning_field(tuning, field: str, message: str, tmp_path: Path) -> None:
    out = inspect(tmp_path, lambda plan: plan.__setitem__("tuning", tuning))
    assert out == f"error: {tmp_path / 'x.plan'}: field {field}: {message}"


# --- slow paths --------------------------------------------------------------------------------------------


def import_chain(tmp_path: Path, files: int, imports: int) -> Path:
    """b0.tr imports b1.tr `imports` times under different names, b1 imports b2 the same way, and so on."""
    for i in range(files):
        lines = [f"policy p{i}"] + [f'import "b{i + 1}.tr" as a{j}' for j in range(imports) if i + 1 < files]
        lines.append(f"param x: int = {i}")
        if i == 0:
            lines += ['model slm = "m/a"', 'model llm = "m/b"', "entry slm", "route slm {",
                      "  when generated > a0.x + a3.x -> llm", "}"]  # fmt: skip
        (tmp_path / f"b{i}.tr").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path / "b0.tr"


def test_an_import_bomb_loads_each_file_once(tmp_path: Path) -> None:
    root = import_chain(tmp_path, files=9, imports=4)  # 4^8 = 65,536 units when each import was loaded anew
    result = compile_file(root)
    assert result.plan is not None, [d.render() for d in result.diagnostics]
    assert sorted(result.plan["params"]) == sorted(["x", *("a0." * i + "x" for i in range(1, 9))])
    assert [n["value"] for n in result.plan["routes"]["slm"]["nodes"] if n["op"] == "const"] == [1]


def test_a_define_may_name_a_shared_file_through_any_of_its_imports(tmp_path: Path) -> None:
    root = import_chain(tmp_path, files=3, imports=4)
    for name in ("a0.a0.x", "a3.a2.x"):  # b2.tr's x, reached through other imports
        result = compile_file(root, {name: "7"})
        assert result.plan is not None and result.plan["params"]["a0.a0.x"]["value"] == 7
    result = compile_file(root, {"a4.x": "7"})
    assert [d.message for d in result.errors] == ["-D a4.x=7: no param named 'a4.x' (did you mean 'a0.x'?)"]


def test_a_source_over_256_kib_is_refused_with_the_cap(tmp_path: Path) -> None:
    big = tmp_path / "big.tr"
    big.write_text("policy big\n" + "# padding\n" * 30_000, encoding="utf-8")
    code, output = check(str(big))
    assert code == 1 and "the file is 300,011 bytes; a policy source is at most 256 KiB" in output
    assert [d.message for d in compile_source(big.read_text(encoding="utf-8"), "x.tr").errors] == [
        "the file is 300,011 bytes; a policy source is at most 256 KiB"
    ]
    policy = tmp_path / "b.tr"  # an imported file too
    policy.write_text(bernoulli("param p", 'import "big.tr"\nparam p'), encoding="utf-8")
    code, output = check(str(policy))
    assert code == 1 and f"{big}: error: the file is 300,011 bytes" in output


def test_a_large_file_full_of_syntax_errors_is_not_parsed_again_for_each() -> None:
    lines = [f"param x{i}: int = {'= ' if i % 50 == 0 else ''}{i}" for i in range(9_000)]
    result = compile_source("policy big\n" + "\n".join(lines) + "\n", "big.tr")
    reported = [d.line for d in result.errors]
    assert reported[:3] == [2, 52, 102] and all((line - 2) % 50 == 0 for line in reported)
    assert len(reported) < 32  # not the 64 recoveries of a small file: each one parses the file again


def test_only_the_first_unknown_names_get_a_did_you_mean() -> None:
    lines = [f"param x{i}: int = {i}\nparam y{i}: int = xx{i}" for i in range(2_000)]
    result = compile_source("policy big\n" + "\n".join(lines) + "\n", "big.tr")
    hinted = [d.message for d in result.errors if "did you mean" in d.message]
    assert 40 <= len(hinted) <= 50 and hinted[0] == "unknown name 'xx0' (did you mean 'x0'?)"
    assert "unknown name 'xx1999'" in [d.message for d in result.errors]
