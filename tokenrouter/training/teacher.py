"""Teacher forcing over a folder of text files: windows of tokens, and per position what each model of a
plan predicts (greedy token, NLL of the true next token) plus the entry model's per-step features
(docs/ir.md semantics) and router inputs.

Row t of a window holds the models' outputs after reading tokens 0..t, i.e. their prediction of token
t+1. The first ``prompt`` rows of each window are context only (not scored; the query-level baseline
reads the entry model's entropy over them). Features that depend on the request's history use:
``position`` = t + 2 (the sequence length once the token is committed), ``generated`` = t + 2 - prompt,
``run_length`` = ``generated`` (teacher forcing has no hand-off history; a policy reading run_length is
approximated).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenrouter.progress import Progress

from .corpus import read_text_dir
from .policy_view import PolicyViewError


@dataclass(slots=True)
class TeacherConfig:
    seq_len: int = 256  # tokens per window
    prompt: int = 16  # leading rows of each window that are context only
    max_tokens: int = 40_000  # scored positions at most (windows are sampled, seeded)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.seq_len < 8:
            raise ValueError(f"seq_len must be >= 8, got {self.seq_len}")
        if not 1 <= self.prompt < self.seq_len - 1:
            raise ValueError(f"prompt must be in [1, seq_len - 2], got {self.prompt}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(slots=True)
class Window:
    file: str
    ids: list[int]  # seq_len + 1 tokens at most: inputs ids[:-1], targets ids[1:]


def make_windows(data_dir: Path, tokenizer_dir: Path, cfg: TeacherConfig) -> list[Window]:
    from .tokenizer import encode_document, load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    windows: list[Window] = []
    for name, text in read_text_dir(data_dir):
        ids = encode_document(tok, text)
        for s in range(0, len(ids) - 1, cfg.seq_len):
            w = ids[s : s + cfg.seq_len + 1]
            if len(w) - 1 >= cfg.prompt + 8:
                windows.append(Window(name, w))
    random.Random(cfg.seed).shuffle(windows)
    out, scored = [], 0
    for w in windows:
        if scored >= cfg.max_tokens:
            break
        out.append(w)
        scored += len(w.ids) - 1 - cfg.prompt
    if not out:
        raise ValueError(f"no window of at least {cfg.prompt + 8} tokens in {data_dir}")
    return out


def step_features(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """docs/ir.md features of greedy steps over rows of logits [T, V] (float32)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    token = torch.argmax(lp, dim=-1)  # ties -> lowest index
    p = lp.exp()
    top2 = p.topk(2, dim=-1).values
    ent = -(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum(-1)
    return {
        "token": token,
        "logprob": lp.gather(1, token[:, None])[:, 0],
        "confidence": top2[:, 0],
        "margin": top2[:, 0] - top2[:, 1],
        "entropy": ent,
        "norm_entropy": ent / math.log(logits.shape[-1]),
    }


@dataclass(slots=True)
class TeacherData:
    """Per scored position (rows), concatenated over windows, plus per-window bookkeeping."""

    models: list[str]
    target: torch.Tensor  # [N] the true next token
    greedy: dict[str, torch.Tensor] = field(default_factory=dict)  # model -> [N] argmax token
    nll: dict[str, torch.Tensor] = field(default_factory=dict)  # model -> [N] -log p(target)
    features: dict[str, torch.Tensor] = field(default_factory=dict)  # entry model's, by feature name
    router_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # router name -> [N, D]
    window: torch.Tensor | None = None  # [N] window index of each row
    window_file: list[str] = field(default_factory=list)
    prompt_entropy: torch.Tensor | None = None  # [W] entry model's mean entropy over each window's prompt
    # only with teacher_force(expected=True), per model m other than the entry model, under m's own
    # distribution p_m: "acc/m" = p_m(m's greedy token) - p_m(entry's greedy token), the accuracy m adds
    # in expectation; "nll/m" = KL(p_m || p_entry), the NLL m saves in expectation
    expected: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.target.shape[0])

    def correct(self, model: str) -> torch.Tensor:
        return self.greedy[model] == self.target

    def subset(self, rows: torch.Tensor) -> TeacherData:
        """The rows where the bool mask ``rows`` holds (window bookkeeping kept as is)."""
        return TeacherData(
            models=self.models,
            target=self.target[rows],
            greedy={k: v[rows] for k, v in self.greedy.items()},
            nll={k: v[rows] for k, v in self.nll.items()},
            features={k: v[rows] for k, v in self.features.items()},
            router_inputs={k: v[rows] for k, v in self.router_inputs.items()},
            window=self.window[rows],
            window_file=self.window_file,
            prompt_entropy=self.prompt_entropy,
            expected={k: v[rows] for k, v in self.expected.items()},
        )


def load_engines(plan: dict, models: list[str]) -> dict:
    from tokenrouter.runtime import threads
    from tokenrouter.runtime.engine.base import EngineError
    from tokenrouter.runtime.engine.embedded import load_engine

    threads.set_torch_threads(len(plan["models"]))
    engines = {}
    for m in models:
        try:
            engines[m] = load_engine(plan["models"][m]["path"], device="cpu", dtype="float32", max_tokens=64)
        except (EngineError, ValueError) as e:
            raise PolicyViewError(f"model {m!r}: {e}") from None
    vocab = {m: e.info.vocab_size for m, e in engines.items()}
    if len(set(vocab.values())) > 1:
        raise PolicyViewError(f"the models must share one vocabulary to be routed per token, got {vocab}")
    return engines


def router_input_values(spec, logits: torch.Tensor, hidden: torch.Tensor, token: torch.Tensor, embed):
    """The concatenated inputs of one router (a RouterSpec) for rows of one model's step outputs."""
    cols = []
    for inp in spec.inputs:
        if inp.kind == "hidden":
            cols.append(hidden.float())
        elif inp.kind == "embedding":
            cols.append(embed(token).float())
        else:
            vals = logits.float().topk(inp.k, dim=-1).values
            if inp.kind == "topk_logprobs":
                vals = vals - torch.logsumexp(logits.float(), dim=-1, keepdim=True)
            cols.append(vals)
    return torch.cat(cols, dim=-1)


class _Buffers:
    """Teacher forcing's outputs by key ("greedy/MODEL", "feat/NAME", …), in buffers allocated once, at their
    final size (`total` rows): keeping one small tensor per window between the large per-window temporaries
    fragments glibc's heap (~15 MB lost per window measured, 23 GB at 2,800 windows)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.cat: dict[str, torch.Tensor] = {}

    def add(self, key: str, row: int, value: torch.Tensor) -> None:
        if key not in self.cat:
            self.cat[key] = torch.empty((self.total, *value.shape[1:]), dtype=value.dtype)
        self.cat[key][row : row + len(value)] = value


@torch.no_grad()
def teacher_force(
    plan: dict,
    entry: str,
    models: list[str],
    windows: list[Window],
    cfg: TeacherConfig,
    routers: dict | None = None,
    expected: bool = False,
) -> TeacherData:
    """Run every model over every window. ``routers``: name -> RouterSpec whose inputs to collect.
    ``expected``: also TeacherData.expected (each model's expected gain over the entry model)."""
    engines = load_engines(plan, models)
    scored = [len(w.ids) - 1 - cfg.prompt for w in windows]
    buf = _Buffers(sum(scored))
    prompt_ent: list[torch.Tensor] = []
    row = 0
    progress = Progress("teacher forcing", len(windows), "windows")
    for wi, w in enumerate(windows):
        progress.update(wi)
        _force_window(buf, row, wi, w, engines, entry, models, cfg, routers or {}, expected, prompt_ent)
        row += scored[wi]
    progress.finish(len(windows))
    return _teacher_data(buf.cat, models, windows, prompt_ent)


def _force_window(buf: _Buffers, row: int, wi: int, w: Window, engines: dict, entry: str, models: list[str],
                  cfg: TeacherConfig, routers: dict, expected: bool, prompt_ent: list) -> None:  # fmt: skip
    """Every model over window `wi`, its scored positions into `buf` from `row` on (the entry model first)."""
    x = torch.tensor(w.ids[:-1], dtype=torch.int64)
    y = torch.tensor(w.ids[1:], dtype=torch.int64)
    s = slice(cfg.prompt, len(x))
    buf.add("target", row, y[s])
    buf.add("window", row, torch.full((len(x) - cfg.prompt,), wi, dtype=torch.int64))
    entry_lp = None
    for m in sorted(models, key=lambda m: m != entry):  # the entry model first
        logits, hidden = engines[m].forward_full(x)
        logits = logits.float()
        lp = torch.log_softmax(logits, dim=-1)
        buf.add(f"greedy/{m}", row, lp[s].argmax(-1))
        buf.add(f"nll/{m}", row, -lp[s].gather(1, y[s, None])[:, 0])
        if m != entry:
            if expected:
                _add_expected(buf, row, m, lp[s], entry_lp)
            continue
        entry_lp = lp[s]
        f = step_features(logits)
        prompt_ent.append(f["entropy"][: cfg.prompt].mean())
        t = torch.arange(len(x))
        gen = t + 2 - cfg.prompt
        f.update(position=t + 2, generated=gen, run_length=gen)
        for k, v in f.items():
            buf.add(f"feat/{k}", row, v[s])
        for name, spec in routers.items():
            xs = router_input_values(spec, logits[s], hidden[s], f["token"][s], engines[m].embed)
            buf.add(f"router/{name}", row, xs)


def _add_expected(buf: _Buffers, row: int, m: str, lp: torch.Tensor, entry_lp: torch.Tensor) -> None:
    """Model `m`'s expected gain over the entry model at each scored position (accuracy and NLL)."""
    p = lp.exp()
    own, theirs = lp.argmax(-1), entry_lp.argmax(-1)
    buf.add(f"expected/acc/{m}", row, (p.gather(1, own[:, None]) - p.gather(1, theirs[:, None]))[:, 0])
    buf.add(f"expected/nll/{m}", row, (p * (lp - entry_lp)).sum(-1))


def _teacher_data(cat: dict[str, torch.Tensor], models: list[str], windows: list[Window],
                  prompt_ent: list[torch.Tensor]) -> TeacherData:  # fmt: skip
    data = TeacherData(models=list(models), target=cat["target"], window=cat["window"],
                       window_file=[w.file for w in windows], prompt_entropy=torch.stack(prompt_ent))  # fmt: skip
    kinds = {"greedy": data.greedy, "nll": data.nll, "feat": data.features, "router": data.router_inputs,
             "expected": data.expected}  # fmt: skip
    for k, v in cat.items():
        kind, _, name = k.partition("/")
        if kind in kinds:
            kinds[kind][name] = v
    return data
