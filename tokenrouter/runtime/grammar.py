"""Constrained decoding: a request's grammar, applied on whichever model writes each of its tokens.

A request's `SamplingSpec.grammar` is an llguidance grammar (its JSON form; the frontend builds it from a
`response_format` or a tool choice, `frontend/structured.py`). A subserver keeps, per request it holds, an
llguidance `LLMatcher` over its own model's tokenizer (`Req.grammar`), advanced by the request's completion
in order: the tokens this model commits, and the ones other models wrote, which a hop brings with it. The
matcher's state is a function of the grammar and the completion so far, so it travels as the tokens do;
nothing else crosses a hop.

Before the route kernel runs, each constrained row gets its matcher's token mask, and its token is drawn from
the masked logits by the kernel's own sampler with the request's seed and position (`sampling.sample`), then
handed to the kernel as a forced token (`RouteKernel(..., forced=)`): the kernel's features and routers still
read the model's own distribution, and the token obeys the grammar. A `drop` hop discards its token before any
matcher takes it. Once the grammar is complete (the matcher has stopped), the request finishes with "stop".
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where masks are applied (subservers), not by the frontend's checks
    import torch

logger = logging.getLogger(__name__)

MATCHER_CACHE = 64  # compiled grammars kept per process (a fresh matcher is a copy of one)


class GrammarError(ValueError):
    """A grammar that does not compile, or a completion it does not accept. The message is for users."""


@functools.lru_cache(maxsize=8)
def load_tokenizer(model_dir: str, vocab_size: int | None = None, eos_ids: tuple[int, ...] = ()):
    """llguidance's tokenizer for a model folder's `tokenizer.json`: `vocab_size` is the width of the model's
    logits (at least the tokenizer's own size), `eos_ids` the model's end-of-sequence tokens (the tokenizer's
    own when empty)."""
    import llguidance

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise GrammarError(f"no tokenizer.json in model folder {model_dir}: constrained decoding needs one")
    return llguidance.LLTokenizer(
        path.read_text(encoding="utf-8"), n_vocab=vocab_size, eos_token=list(eos_ids) or None
    )


def from_json_schema(schema: dict) -> str:
    """The grammar of JSON text that validates against `schema`, with no whitespace beyond `", "` and
    `": "` (a schema may say otherwise in its `x-guidance` options)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})


def from_lark(text: str) -> str:
    """The grammar of a Lark grammar (llguidance's dialect: `%json {schema}` embeds a JSON schema)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(text)


def grammar_error(grammar: str, tokenizer) -> str | None:
    """Why `grammar` cannot constrain decoding with `tokenizer`; None when it can."""
    import llguidance

    return llguidance.LLMatcher.validate_grammar(grammar, tokenizer) or None


@dataclass(slots=True, eq=False)
class GrammarState:
    """One request's matcher on one subserver, and how many tokens of its completion it has taken."""

    matcher: Any
    consumed: int = 0


class Grammars:
    """One subserver's side of constrained decoding: its model's tokenizer (loaded on the first constrained
    request) and the compiled grammars; the matchers themselves live on the requests (`Req.grammar`)."""

    def __init__(self, model_path: str | None, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self.model_path = model_path
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self._compiled: OrderedDict[str, Any] = OrderedDict()

    def tokenizer(self):
        if self.model_path is None:
            raise GrammarError("the model's folder is unknown: constrained decoding needs its tokenizer.json")
        from tokenrouter.hub import model_folder

        folder = str(model_folder(self.model_path, fetch=False))
        return load_tokenizer(folder, self.vocab_size, self.eos_ids)

    def new_matcher(self, grammar: str):
        import llguidance

        base = self._compiled.get(grammar)
        if base is None:
            base = llguidance.LLMatcher(self.tokenizer(), grammar, log_level=0)
            if base.is_error():
                raise GrammarError(f"the grammar does not compile: {base.get_error()}")
            self._compiled[grammar] = base
            if len(self._compiled) > MATCHER_CACHE:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(grammar)
        return base.deep_copy()

    def sync(self, req) -> GrammarState:
        """The request's matcher, made on its first constrained step here and advanced by the tokens of its
        completion it has not taken yet (those written on other models since it was last here)."""
        st = req.grammar
        if st is None:
            st = req.grammar = GrammarState(self.new_matcher(req.sampling.grammar))
        done = req.prompt_len + st.consumed
        if done < len(req.tokens):
            todo = req.tokens[done:]
            if not st.matcher.consume_tokens(todo):
                raise GrammarError(f"the output does not follow the grammar: {st.matcher.get_error()}")
            st.consumed += len(todo)
        if st.matcher.is_error():
            raise GrammarError(f"the output does not follow the grammar: {st.matcher.get_error()}")
        return st

    def accept(self, req, token: int) -> bool:
        """Advance the request's matcher by a token this model commits; True when the grammar is complete.
        A token the grammar refuses leaves the matcher in its error state: the request's next step fails."""
        st = req.grammar
        if st is None or req.prompt_len + st.consumed != len(req.tokens) - 1:
            st = self.sync(req)  # first step here without a mask (cannot happen), or tokens it has not seen
            return st.matcher.is_stopped()
        ok = st.matcher.consume_token(token)
        st.consumed += 1
        if not ok:
            logger.warning("request %s: token %d refused by its grammar: %s", req.rid, token,
                           st.matcher.get_error())  # fmt: skip
            return False
        return st.matcher.is_stopped()

    def forced_tokens(self, rows: list, logits: torch.Tensor, state, sampler: str | None = None):
        """Per row, the token drawn from its grammar-masked logits (-1 for rows without a grammar) [B] int64 on
        the logits' device; None when no row has a grammar. Raises GrammarError for a row whose matcher
        failed (the scheduler then routes the rows one by one and fails that one)."""
        idx = [i for i, r in enumerate(rows) if r.sampling.grammar]
        if not idx:
            return None
        import torch

        from tokenrouter.runtime.sampling import DEFAULT_SAMPLER, sample

        words = (logits.shape[1] + 31) // 32
        bitmask = torch.zeros((len(idx), words), dtype=torch.int32)
        for j, i in enumerate(idx):
            st = self.sync(rows[i])
            if st.matcher.is_stopped():
                raise GrammarError("the grammar is complete, yet the request goes on")
            # what llguidance.torch's helper does (importing it takes seconds: it sets up a torch.compile)
            row = bitmask[j]
            st.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        allowed = unpack_mask(bitmask.to(logits.device), logits.shape[1])
        dev = logits.device
        at = torch.tensor(idx, dtype=torch.int64, device=dev)
        masked = logits.index_select(0, at).float().masked_fill(~allowed, float("-inf"))
        hot = [rows[i].sampling for i in idx if rows[i].sampling.temperature > 0]
        tok = sample(masked, state.temperature.index_select(0, at), state.top_k.index_select(0, at),
                     state.top_p.index_select(0, at), state.seed.index_select(0, at),
                     state.position.index_select(0, at), all_greedy=not hot,
                     restrict=any(s.top_k > 0 or s.top_p < 1.0 for s in hot),
                     sampler=sampler or DEFAULT_SAMPLER)  # fmt: skip
        return torch.full((len(rows),), -1, dtype=torch.int64, device=dev).index_copy_(0, at, tok)


def unpack_mask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's token bitmask [n, ceil(V / 32)] int32 (bit j of word w: token 32 w + j) as bool [n, V]."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
