"""Shared helpers of the subserver tests: policies on the tiny example models, stdlib plans, an engine spy."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.runtime.engine.base import Engine, StepOutput
from tokenrouter.runtime.engine.held import EngineRowError

ROOT = Path(__file__).resolve().parents[3]
SMALL = str(ROOT / "examples/models/tiny-small")
LARGE = str(ROOT / "examples/models/tiny-large")
STDLIB = ROOT / "tokenrouter/stdlib"

# Policies exercising every hand-off form. `uniform()` is a pure function of (seed, position), so the
# routing is the same whatever the batching, and it fires often.
POLICIES = {
    "keep": """
policy keep_test
model a = "{a}" {{ batch: {ba} }}
model b = "{b}" {{ batch: {bb} }}
serve {{ concurrency: 16, max_delay_ms: 5 }}
entry a
route a {{ when uniform() < 0.3 -> b }}
route b {{ when uniform() < 0.5 -> a }}
""",
    "drop": """
policy drop_test
model a = "{a}" {{ batch: {ba} }}
model b = "{b}" {{ batch: {bb} }}
serve {{ concurrency: 16, max_delay_ms: 5 }}
entry a
route a {{ when uniform() < 0.3 -> b drop }}
route b {{ -> a }}
""",
    "for_k": """
policy for_test
model a = "{a}" {{ batch: {ba} }}
model b = "{b}" {{ batch: {bb} }}
serve {{ concurrency: 16, max_delay_ms: 5 }}
entry a
route a {{
  when uniform() < 0.15 -> b drop for 3
  when uniform() < 0.3 -> b for 2
}}
route b {{ when uniform() < 0.9 -> a drop }}
""",
    "relay": """
policy relay_test
model a = "{a}" {{ batch: {ba} }}
model b = "{b}" {{ batch: {bb} }}
serve {{ concurrency: 16, max_delay_ms: 5 }}
entry a
route a {{ -> b }}
route b {{ -> a }}
""",
    "solo": """
policy solo_test
model a = "{a}" {{ batch: {ba} }}
entry a
""",
    "three": """
policy three_test
model a = "{a}" {{ batch: {ba} }}
model b = "{b}" {{ batch: {bb} }}
model c = "{c}" {{ batch: {bc} }}
serve {{ concurrency: 16, max_delay_ms: 5 }}
entry a
route a {{
  when uniform() < 0.2 -> b
  when uniform() < 0.4 -> c drop
}}
route b {{ when uniform() < 0.5 -> c }}
route c {{ when uniform() < 0.6 -> a for 2 }}
""",
}


class SpyEngine(Engine):
    """The real engine, recording each step's rows (rid, new tokens); `fail_rid` makes it refuse that
    request as one that can never fit."""

    def __init__(self, inner: Engine, fail_rid: str | None = None) -> None:
        self.inner = inner
        self.info = inner.info
        self.calls: list[tuple[str, list[int]]] = []
        self.fail_rid = fail_rid

    def forward(self, batch, want_hidden: bool = False) -> StepOutput:
        for r in batch:
            if r.rid == self.fail_rid:
                raise EngineRowError(r.rid, "does not fit")
        self.calls.extend((r.rid, list(r.new_token_ids)) for r in batch)
        return self.inner.forward(batch, want_hidden)

    def release(self, rid: str) -> None:
        self.inner.release(rid)

    def embed(self, token_ids):
        return self.inner.embed(token_ids)

    def seq_len(self, rid: str) -> int:
        return self.inner.seq_len(rid)

    def stats(self) -> dict:
        return self.inner.stats()

    def kv_room(self):
        return self.inner.kv_room()

    def resident(self, rid: str) -> bool:
        return self.inner.resident(rid)

    @property
    def max_len(self):
        return getattr(self.inner, "max_len", None)


def all_free(engines) -> bool:
    """Every engine holds no request, and each page of its KV pool is free or in its prefix cache (which gives
    them back on demand)."""
    stats = [e.stats() for e in engines]
    return all(
        s["pages_free"] + s.get("prefix_cached_tokens", 0) == s["pages_total"] and s["requests"] == 0
        for s in stats
    )


def compile_policy(tmp: Path, name: str, batch: dict[str, int] | None = None, **paths) -> dict:
    from tokenrouter.compiler.driver import compile_file

    batch = batch or {}
    text = POLICIES[name].format(
        a=paths.get("a", SMALL),
        b=paths.get("b", LARGE),
        c=paths.get("c", SMALL),
        ba=batch.get("a", 1),
        bb=batch.get("b", 1),
        bc=batch.get("c", 1),
    )
    src = tmp / f"{name}.tr"
    src.write_text(text)
    res = compile_file(src)
    assert res.ok, [str(d) for d in res.diagnostics]
    return res.plan


STDLIB_DEFINES = {  # model params -> the tiny models (a third model: tiny-small again); routers -> tmp files
    "bernoulli": {"slm_path": SMALL, "llm_path": LARGE},
    "citer": {"slm_path": SMALL, "llm_path": LARGE, "router_path": "{tmp}/citer.safetensors"},
    "co_llm": {"base_path": SMALL, "assistant_path": LARGE, "head_path": "{tmp}/co_llm.safetensors"},
    "multi_expert": {"a_path": SMALL, "b_path": LARGE, "c_path": SMALL},
    # the untrained router's sigmoid stays in (0.3, 0.45) on these prompts: 0.35 makes it fire sometimes
    "r2r": {
        "slm_path": SMALL,
        "llm_path": LARGE,
        "router_path": "{tmp}/r2r.safetensors",
        "threshold": "0.35",
    },
    "r_stitch": {"slm_path": SMALL, "llm_path": LARGE},
}


def compile_stdlib(tmp: Path, name: str) -> dict:
    """A stdlib policy on the tiny models, with untrained routers (what `tokenrouter init-router` writes)."""
    from tokenrouter.compiler.driver import compile_file
    from tokenrouter.runtime.route.routers import (
        RouterSpec,
        model_hidden_size,
        untrained_router_tensors,
        write_router,
    )

    defines = {k: v.format(tmp=tmp) for k, v in STDLIB_DEFINES[name].items()}
    res = compile_file(STDLIB / f"{name}.tr", defines, weights_check=False)  # the routers are written below
    assert res.ok, [str(d) for d in res.diagnostics]
    for rname, entry in res.plan["routers"].items():
        spec = RouterSpec.from_plan(rname, entry)
        width = spec.width(model_hidden_size(res.plan["models"][entry["model"]]["path"]))
        write_router(entry["path"], spec, untrained_router_tensors(spec.kind, width, seed=1))
    return res.plan
