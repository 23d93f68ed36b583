"""Route IRs written by hand for the kernel tests (docs/ir.md), through a tiny builder that applies the IR's
typing rules. Together the cases use every feature and every operation (a test checks that)."""

from __future__ import annotations

ARITH = {"add", "sub", "mul", "min", "max"}


class IR:
    def __init__(self, model: str = "slm") -> None:
        self.model = model
        self.nodes: list[dict] = []
        self.rules: list[dict] = []
        self.routers: list[str] = []

    def _add(self, node: dict) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def t(self, i: int) -> str:
        return self.nodes[i]["type"]

    def const(self, value) -> int:
        typ = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"
        return self._add({"op": "const", "value": value, "type": typ})

    def feature(self, name: str) -> int:
        typ = "int" if name in ("token", "run_length", "generated", "position") else "float"
        return self._add({"op": "feature", "name": name, "type": typ})

    def router(self, name: str) -> int:
        if name not in self.routers:
            self.routers.append(name)
        return self._add({"op": "router", "name": name, "type": "float"})

    def uniform(self) -> int:
        return self._add({"op": "uniform", "type": "float"})

    def op(self, op: str, *args: int) -> int:
        types = [self.t(a) for a in args]
        if op in ARITH or op in ("neg", "abs"):
            typ = "float" if "float" in types else "int"
        elif op in ("div", "log", "exp", "sigmoid"):
            typ = "float"
        else:
            typ = "bool"
        return self._add({"op": op, "args": list(args), "type": typ})

    def rule(self, cond: int | None, target: str = "llm") -> None:
        self.rules.append({"cond": cond, "target": target, "drop": False, "for": None,
                           "source": f"rule {len(self.rules)}", "line": len(self.rules) + 1})  # fmt: skip

    def build(self) -> dict:
        features = sorted({n["name"] for n in self.nodes if n["op"] == "feature"})
        return {
            "model": self.model,
            "features": features,
            "routers": list(self.routers),
            "uses_uniform": any(n["op"] == "uniform" for n in self.nodes),
            "nodes": self.nodes,
            "rules": self.rules,
        }


def citer_like() -> dict:
    """when confidence < 0.3 -> llm; when margin < 0.05 and entropy > 1.5 -> mid."""
    b = IR()
    b.rule(b.op("lt", b.feature("confidence"), b.const(0.3)))
    b.rule(
        b.op(
            "and",
            b.op("lt", b.feature("margin"), b.const(0.05)),
            b.op("gt", b.feature("entropy"), b.const(1.5)),
        ),
        "mid",
    )
    return b.build()


def entropy_band() -> dict:
    """when not (norm_entropy < 0.2 or norm_entropy > 0.6) -> llm, then an unconditional hand-off."""
    b = IR()
    ne = b.feature("norm_entropy")
    b.rule(b.op("not", b.op("or", b.op("lt", ne, b.const(0.2)), b.op("gt", ne, b.const(0.6)))))
    b.rule(None, "mid")
    return b.build()


def bernoulli_split() -> dict:
    """when uniform() < 0.5 -> a; when uniform() < 0.8 -> b (50/30/20)."""
    b = IR()
    u = b.uniform()
    b.rule(b.op("lt", u, b.const(0.5)), "a")
    b.rule(b.op("lt", u, b.const(0.8)), "b")
    return b.build()


def counters() -> dict:
    """Integer features and arithmetic: run_length, generated, position, token in [...], int/float mixing."""
    b = IR()
    rl, gen, pos, tok = (
        b.feature("run_length"),
        b.feature("generated"),
        b.feature("position"),
        b.feature("token"),
    )
    in_list = b.op(
        "or",
        b.op("eq", tok, b.const(3)),
        b.op("or", b.op("eq", tok, b.const(7)), b.op("eq", tok, b.const(11))),
    )
    b.rule(in_list, "a")
    b.rule(b.op("ge", b.op("sub", pos, gen), b.const(12)), "b")  # prompt length >= 12
    b.rule(
        b.op(
            "gt", b.op("div", b.op("add", b.op("mul", rl, b.const(2)), b.const(1)), b.const(3.0)), b.const(2)
        ),
        "c",
    )
    b.rule(b.op("ne", b.op("max", rl, b.op("min", gen, b.const(4))), b.op("abs", b.op("neg", rl))), "d")
    b.rule(b.op("le", b.op("add", gen, b.const(0.5)), b.const(2)), "e")
    return b.build()


def float_functions() -> dict:
    """log / exp / sigmoid / abs / neg / min / max / div on float features."""
    b = IR()
    lp, conf, mar = b.feature("logprob"), b.feature("confidence"), b.feature("margin")
    b.rule(b.op("lt", b.op("exp", lp), b.const(0.05)), "a")
    b.rule(b.op("gt", b.op("log", conf), b.const(-0.7)), "b")
    b.rule(b.op("ge", b.op("sigmoid", b.op("add", lp, b.const(2.5))), b.const(0.75)), "c")
    b.rule(b.op("lt", b.op("abs", b.op("sub", mar, b.op("div", conf, b.const(2.0)))), b.const(0.02)), "d")
    b.rule(b.op("eq", b.op("min", b.op("neg", lp), b.op("max", b.const(1.0), mar)), b.const(1.0)), "e")
    return b.build()


def bools_and_ties() -> dict:
    """bool constants and bool == bool; margin == 0 exactly on a tie."""
    b = IR()
    tie = b.op("eq", b.feature("margin"), b.const(0.0))
    b.rule(b.op("and", b.const(True), tie), "a")
    b.rule(b.op("eq", b.op("gt", b.feature("confidence"), b.const(0.5)), b.const(False)), "b")
    return b.build()


def with_router(inputs: str = "hidden") -> dict:
    """when sigmoid(gate) > 0.5 -> llm; when gate < -0.2 and confidence < 0.9 -> mid."""
    b = IR()
    g = b.router("gate")
    b.rule(b.op("gt", b.op("sigmoid", g), b.const(0.5)))
    b.rule(
        b.op("and", b.op("lt", g, b.const(-0.2)), b.op("lt", b.feature("confidence"), b.const(0.9))), "mid"
    )
    return b.build()


def no_rules() -> dict:
    return IR().build()


CASES = {
    "citer_like": citer_like,
    "entropy_band": entropy_band,
    "bernoulli_split": bernoulli_split,
    "counters": counters,
    "float_functions": float_functions,
    "bools_and_ties": bools_and_ties,
    "no_rules": no_rules,
}


STDLIB_HIDDEN = 16


def stdlib_policies() -> list:
    from pathlib import Path

    import tokenrouter.stdlib

    return sorted(Path(tokenrouter.stdlib.__file__).parent.glob("*.tr"))


def runnable_stdlib_plan(path, tmp) -> dict:
    """Compile a stdlib policy; give each of its routers an untrained file (hidden size STDLIB_HIDDEN) in tmp,
    with outputs spread around 0 so that rules fire on some rows and not on others."""
    import os

    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.runtime.route.routers import RouterSpec, untrained_router_tensors, write_router

    result = compile_file(path, weights_check=False)  # hub models; the router files are written below
    assert result.ok, [str(d) for d in result.errors]
    plan = result.plan
    for name, entry in plan["routers"].items():
        entry["path"] = os.path.join(str(tmp), f"{name}.safetensors")
        spec = RouterSpec.from_plan(name, entry)
        tensors = untrained_router_tensors(spec.kind, spec.width(STDLIB_HIDDEN), (8,), seed=3)
        last = "bias" if spec.kind == "linear" else "layers.1.bias"
        tensors[last] += 0.05
        write_router(entry["path"], spec, tensors)
    return plan
