"""Fuzz `tokenrouter check` and `inspect` with hostile input (issue 57): mutated policies (the shipped ones with
tokens and characters deleted, inserted, swapped, hostile literals and paths among the inserts, now and then a
byte that is not UTF-8), the hand-made hostile policies and router files, and hand-edited plans. Every input
goes through the command's own code path in-process (typer's runner), a sample through the real command line.
Nothing may end in a traceback, and every exit code is 0 (ok), 1 (errors in the input) or 2 (bad usage).

    python bench/fuzz_check.py [--n 10000] [--plans 500] [--cli 50] [--seed 57] [--keep DIR]

Prints one row per kind of input: files (for `check` on the command line: runs of up to 10 files), exit codes,
tracebacks, the slowest file (run) and its time. `--keep DIR`
keeps every input that ended in a traceback there. tests/dsl/test_fuzz.py runs a small campaign of the same.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SEEDS = sorted([*REPO.glob("tokenrouter/stdlib/*.tr"), *EXAMPLES.glob("*.tr")])
VOCAB = ["policy", "param", "model", "router", "fn", "route", "entry", "serve", "import", "when", "->", "drop",
         "for", "and", "or", "not", "in", "auto", "true", "{", "}", "(", ")", "[", "]", ",", ":", "=", "==", "<",
         "-", "/", "*", "0", "-1", "1e309", "1e300", "3.5e38", "0.5", "9223372036854775808", "9" * 400, '"', '"x"',
         "#", "\n", "a", "slm", "llm", "token", "uniform()", "stdlib.citer", "x.y", "\\", "é", "\t", "\0",
         '"~nosuchuser/m"', '"a\0b"', '"' + "a" * 5000 + '"', '"models/py-small"', '"../x.tr"', 'import "x.tr"',
         "max_delay_ms", "concurrency", "batch", "gpu", "mem", "topk_logits(slm, 100000)", "exp(1000)"]  # fmt: skip
BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]
_TOKEN = None


def tokens(text: str) -> list[str]:
    global _TOKEN
    if _TOKEN is None:
        import re

        _TOKEN = re.compile(r"\s+|\w+|->|==|<=|>=|!=|.", re.S)
    return _TOKEN.findall(text)


def mutate(text: str, rng: random.Random) -> bytes:
    """`text` with 1 to 4 random edits, as the bytes of a file (now and then one that is not UTF-8)."""
    toks = tokens(text)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        if not toks:
            toks = [rng.choice(VOCAB)]
        i, j = rng.randrange(len(toks)), rng.randrange(len(toks))
        if kind == 0:
            del toks[i]
        elif kind == 1:
            toks.insert(i, rng.choice(VOCAB))
        elif kind == 2:
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == 3:
            s = "".join(toks)
            pos = rng.randrange(len(s) + 1)
            toks = tokens(s[:pos] + rng.choice(VOCAB)[:1] + s[pos + 1 :])
        else:
            toks.insert(i, " ")
    data = "".join(toks).encode("utf-8")
    if rng.random() < 0.02:
        pos = rng.randrange(len(data) + 1)
        data = data[:pos] + rng.choice(BAD_BYTES) + data[pos:]
    return data


def workdir(root: Path) -> Path:
    """A folder where the shipped policies' relative paths (models/, routers/) resolve as in examples/."""
    for name in ("models", "routers"):
        (root / name).symlink_to(EXAMPLES / name)
    return root


# --- hand-made hostile inputs -----------------------------------------------------------------------------------


def _bernoulli(old: str, new: str) -> str:
    return (EXAMPLES / "bernoulli.tr").read_text(encoding="utf-8").replace(old, new)


def _router_policy(root: Path, name: str, header: bytes) -> str:
    (root / f"{name}.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    text = (EXAMPLES / "r2r_kd.tr").read_text(encoding="utf-8")
    return text.replace('"routers/py_kd_r2r_divergence.safetensors"', f'"{name}.safetensors"')


def hostile_policies(root: Path) -> list[Path]:
    """The hand-made hostile policies of issue 57, written under `root` (a `workdir`)."""
    cases: dict[str, str | bytes] = {
        "float_1e300": _bernoulli("uniform() < p", "uniform() < 1e300"),
        "float_inf": _bernoulli("uniform() < p", "uniform() < 1e309"),
        "int_65_bits": _bernoulli("slm_batch: int = 2", "slm_batch: int = 36893488147419103232"),
        "int_5000_digits": _bernoulli("slm_batch: int = 2", "slm_batch: int = " + "1" * 5000),
        "int_overflow_folded": _bernoulli("slm_batch: int = 2", "slm_batch: int = 9223372036854775807 + 1"),
        "float_param_400_digits": _bernoulli("p: float = 0.2", "p: float = " + "9" * 400),
        "max_delay_400_digits": _bernoulli("max_delay_ms: 5", "max_delay_ms: " + "9" * 400),
        "model_path_5000": _bernoulli('"models/py-small"', '"' + "a" * 5000 + '"'),
        "model_path_nul": _bernoulli('"models/py-small"', '"a\0b"'),
        "model_path_tilde": _bernoulli('"models/py-small"', '"~nosuchuser/m"'),
        "import_path_nul": _bernoulli("param p", 'import "x\0y.tr" as z\nparam p'),
        "import_path_tilde": _bernoulli("param p", 'import "~nosuchuser/x.tr" as z\nparam p'),
        "router_shape_str": _router_policy(root, "shape", json.dumps({"weight": {"dtype": "F32", "shape": ["a"]}}).encode()),
        "router_deep": _router_policy(root, "deep", b"[" * 50_000 + b"]" * 50_000),
        "router_metadata_list": _router_policy(root, "meta", json.dumps({"__metadata__": [1, 2]}).encode()),
        "router_dtype_list": _router_policy(root, "dtype", json.dumps({"w": {"dtype": [1], "shape": [1]}}).encode()),
        "not_utf8": _bernoulli("entry slm", "entry s").encode() + b"\xff\n",
        "large_1mb": "policy big\n" + "".join(f"param x{i}: int = {i}\n" for i in range(50_000)),
        "large_250kb_errors": "policy big\n" + "".join(f"param x{i}: int = {'= ' * (i % 50 == 0)}{i}\n" for i in range(10_000)),
        "large_250kb_unknown": "policy big\n" + "".join(f"param x{i}: int = {i}\nparam y{i}: int = z{i}\n" for i in range(5_000)),
    }  # fmt: skip
    for i in range(9):  # an import bomb: each file imports the next 4 times under different names
        lines = [f"policy p{i}"] + [f'import "bomb{i + 1}.tr" as a{j}' for j in range(4) if i < 8]
        lines += [f"param x: int = {i}"]
        if i == 0:
            lines += ['model slm = "m/a"', 'model llm = "m/b"', "entry slm", "route slm {", "  when generated > a0.x -> llm", "}"]  # fmt: skip
        (root / f"bomb{i}.tr").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = [root / "bomb0.tr"]
    for name, text in cases.items():
        path = root / f"{name}.tr"
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        out.append(path)
    return out


HOSTILE_VALUES: list[object] = [5, -1, 0, "x", "", [], {}, None, True, 2**70, 1e300, -1e300, "a" * 5000, "a\0b",
                                "~nosuchuser/x", [[[[[[]]]]]], {"a": {"b": [1, "2", None]}}, [1, "x"], {"warnings": 5}]  # fmt: skip


def _paths_in(plan: object, prefix: tuple = ()) -> Iterable[tuple]:
    """Every place in a plan: the key paths of its objects' values and lists' items."""
    if isinstance(plan, dict):
        for k, v in plan.items():
            yield (*prefix, k)
            yield from _paths_in(v, (*prefix, k))
    elif isinstance(plan, list):
        for i, v in enumerate(plan):
            yield (*prefix, i)
            yield from _paths_in(v, (*prefix, i))


def hostile_plans(root: Path, n: int, rng: random.Random) -> list[Path]:
    """Plans of two shipped policies, edited by hand: the cases of issue 57, then `n` random edits (a value
    replaced by a hostile one, or a field deleted)."""
    from tokenrouter.compiler.driver import compile_file

    plans = []
    for name in ("bernoulli", "r2r_kd"):
        result = compile_file(EXAMPLES / f"{name}.tr")
        assert result.plan is not None
        plans.append(result.plan)
    out = []

    def write(name: str, text: str) -> None:
        path = root / f"{name}.plan"
        path.write_text(text, encoding="utf-8")
        out.append(path)

    def edited(plan: dict, where: tuple, value: object, delete: bool = False) -> str:
        copy = json.loads(json.dumps(plan))
        node = copy
        for k in where[:-1]:
            node = node[k]
        if delete and isinstance(node, dict):
            node.pop(where[-1], None)
        else:
            node[where[-1]] = value
        return json.dumps(copy)

    bern, r2r = plans
    for path in ("a" * 5000, "a\0b", "~nosuchuser/x"):
        write(f"model_path_{len(out)}", edited(bern, ("models", "slm", "path"), path))
        write(f"router_path_{len(out)}", edited(r2r, ("routers", "divergence", "path"), path))
    write("json_deep", "[" * 100_000 + "]" * 100_000)
    write("tuning_warnings_5", edited(bern, ("tuning",), {"warnings": 5}))
    write("const_1e300", json.dumps(bern).replace('"value": 0.2', '"value": 1e300'))
    for i in range(n):
        plan = rng.choice(plans)
        places = list(_paths_in(plan))
        where = rng.choice(places + [("tuning",)])
        write(f"random_{i}", edited(plan, where, rng.choice(HOSTILE_VALUES), delete=rng.random() < 0.1))
    return out


# --- running ----------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    files: int = 0
    codes: Counter = field(default_factory=Counter)
    tracebacks: list[tuple[Path, str]] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")

    def add(self, path: Path, code: int, traceback: str | None, seconds: float) -> None:
        self.files += 1
        self.codes[code] += 1
        if traceback is not None:
            self.tracebacks.append((path, traceback))
        if seconds > self.slowest[0]:
            self.slowest = (seconds, path.name)


def in_process(command: str) -> Callable[[Path], tuple[int, str | None]]:
    """`tokenrouter COMMAND FILE` through typer's runner: (exit code, the traceback of an exception or None)."""
    import traceback

    from typer.testing import CliRunner

    from tokenrouter.cli import app

    runner = CliRunner()

    def run(path: Path) -> tuple[int, str | None]:
        r = runner.invoke(app, [command, str(path)])
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            tb = "".join(
                traceback.format_exception(type(r.exception), r.exception, r.exception.__traceback__)
            )
            return r.exit_code, tb
        return r.exit_code, None

    return run


def run_all(paths: Iterable[Path], run: Callable[[Path], tuple[int, str | None]], tally: Tally) -> Tally:
    for path in paths:
        start = time.perf_counter()
        code, tb = run(path)
        tally.add(path, code, tb, time.perf_counter() - start)
    return tally


def cli(command: str, paths: list[Path], tally: Tally, batch: int = 10) -> Tally:
    """The real command line, `batch` files an invocation (`check` takes several; `inspect` one)."""
    step = batch if command == "check" else 1
    for i in range(0, len(paths), step):
        group = paths[i : i + step]
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "tokenrouter.cli", command, *map(str, group)],
                              capture_output=True, text=True, errors="replace", timeout=600)  # fmt: skip
        tb = proc.stderr if "Traceback (most recent call last)" in proc.stderr else None
        tally.add(group[0], proc.returncode, tb, time.perf_counter() - start)
    return tally


def campaign(root: Path, n: int, plans: int, cli_sample: int, seed: int) -> dict[str, Tally]:
    """Write every input under `root` (a `workdir`) and run it; one `Tally` per kind of input."""
    rng = random.Random(seed)
    texts = [p.read_text(encoding="utf-8") for p in SEEDS]
    mutated = []
    for i in range(n):
        path = root / f"m{i:05d}.tr"
        path.write_bytes(mutate(rng.choice(texts), rng))
        mutated.append(path)
    check, inspect = in_process("check"), in_process("inspect")
    hostile = hostile_policies(root)
    edited = hostile_plans(root, plans, rng)
    sample = rng.sample(mutated, min(cli_sample, len(mutated)))
    return {
        "mutated policies (check)": run_all(mutated, check, Tally()),
        "hostile policies (check)": run_all(hostile, check, Tally()),
        "hand-edited plans (inspect)": run_all(edited, inspect, Tally()),
        "CLI check, 10 files a run": cli("check", sample + hostile, Tally()),
        "CLI inspect": cli("inspect", edited[: max(1, cli_sample // 10)], Tally()),
    }


def table(results: dict[str, Tally]) -> str:
    head = f"{'inputs':<28} {'files':>6} {'exit 0':>7} {'exit 1':>7} {'exit 2':>7} {'other':>6} {'tracebacks':>10}  slowest"
    lines = [head, "-" * len(head)]
    for name, t in results.items():
        other = sum(c for code, c in t.codes.items() if code not in (0, 1, 2))
        lines.append(f"{name:<28} {t.files:>6} {t.codes[0]:>7} {t.codes[1]:>7} {t.codes[2]:>7} {other:>6} "
                     f"{len(t.tracebacks):>10}  {t.slowest[0]:.2f} s {t.slowest[1]}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000, help="mutated policies")
    ap.add_argument(
        "--plans", type=int, default=500, help="randomly edited plans (besides the hand-made ones)"
    )
    ap.add_argument("--cli", type=int, default=50, help="mutated policies also run through the command line")
    ap.add_argument("--seed", type=int, default=57)
    ap.add_argument("--keep", type=Path, help="copy the inputs that ended in a traceback here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fuzz_check_") as tmp:
        start = time.perf_counter()
        results = campaign(workdir(Path(tmp)), args.n, args.plans, args.cli, args.seed)
        print(table(results))
        print(f"({time.perf_counter() - start:.0f} s, seed {args.seed})")
        for name, t in results.items():
            for path, tb in t.tracebacks[:3]:
                print(f"\n{name}: {path.name}\n{tb}", file=sys.stderr)
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, args.keep / path.name)
    if any(t.tracebacks or set(t.codes) - {0, 1, 2} for t in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
