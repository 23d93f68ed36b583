"""Shared helpers of the subserver tests: tiny policies, compiling them, building executors."""

from __future__ import annotations

from pathlib import Path

import torch

from tokenrouter.runtime.engine.base import Engine, ModelInfo, StepOutput

# Policies exercising every hand-off form on random tiny models. `uniform()` is a pure function of
# (seed, position), so the routing is the same whatever the batching, and it fires often.
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


class RecomputeEngine(Engine):
    """INTERIM, until the embedded engine lands: the Engine contract without a KV cache (every step
    re-runs the request's whole history through the model's `forward_full`)."""

    def __init__(self, model, name: str, max_len: int = 512) -> None:
        self.model = model
        cfg = model.config
        self.info = ModelInfo(name, cfg.vocab_size, cfg.hidden_size, max_len, cfg.eos_token_ids,
                              torch.float32, torch.device("cpu"))  # fmt: skip
        self.hist: dict[str, list[int]] = {}

    def forward(self, batch, want_hidden: bool = False) -> StepOutput:
        logits, hidden = [], []
        for row in batch:
            h = self.hist.setdefault(row.rid, [])
            h.extend(row.new_token_ids)
            lg, hd = self.model.forward_full(torch.tensor(h))
            logits.append(lg[-1])
            hidden.append(hd[-1])
        return StepOutput(torch.stack(logits), torch.stack(hidden) if want_hidden else None)

    def release(self, rid: str) -> None:
        self.hist.pop(rid, None)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(token_ids)

    def seq_len(self, rid: str) -> int:
        return len(self.hist.get(rid, ()))

    def stats(self) -> dict:
        return {"pages_total": 0, "pages_free": 0, "held": len(self.hist), "evictions": 0}


def tiny_model(seed: int):
    from tokenrouter.runtime.engine.config import ModelConfig
    from tokenrouter.runtime.engine.models.loader import build_empty, init_dummy_weights

    cfg = ModelConfig(family="qwen3", architecture="Qwen3ForCausalLM", hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      vocab_size=96, qk_norm=True, eos_token_ids=(1,))  # fmt: skip
    model = build_empty(cfg, torch.device("cpu"), torch.float32)
    init_dummy_weights(model, seed=seed, std=0.3)
    return model


def compile_policy(tmp: Path, name: str, batch: dict[str, int] | None = None, **paths) -> dict:
    from tokenrouter.compiler.driver import compile_file

    batch = batch or {}
    text = POLICIES[name].format(
        a=paths.get("a", "a-model"),
        b=paths.get("b", "b-model"),
        c=paths.get("c", "c-model"),
        ba=batch.get("a", 1),
        bb=batch.get("b", 1),
        bc=batch.get("c", 1),
    )
    src = tmp / f"{name}.tr"
    src.write_text(text)
    res = compile_file(src)
    assert res.ok, [str(d) for d in res.diagnostics]
    return res.plan
