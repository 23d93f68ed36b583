"""`Req`: one request as one subserver knows it.

A subserver holds a `Req` from the request's first visit until it finishes (or is released/aborted), also
while the request is away on another model (`PENDING`): its KV stays in the engine, and on return only the
tokens written elsewhere are appended and run (an extend).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tokenrouter.runtime.grammar import GrammarState
from tokenrouter.runtime.messages import SamplingSpec


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # arrived (new, or back from a peer), not run on this visit yet
    RUNNING = "running"  # ran at least one step on this visit; runnable again
    PENDING = "pending"  # away on another model; KV kept, never scheduled
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Req:
    rid: str
    tokens: list[int]  # prompt + generated, as known on this subserver
    prompt_len: int
    sampling: SamplingSpec
    status: ReqStatus = ReqStatus.WAITING
    fed: int = 0  # tokens this subserver's engine has run (its KV covers tokens[:fed])
    seen_by: dict[str, int] = field(default_factory=dict)  # model -> how many of `tokens` it has seen
    run_length: int = 0  # tokens committed here since the request last arrived
    for_left: int = 0  # > 0: on a `for K` visit; tokens still to write before going back
    return_to: str | None = None  # where a `for K` visit goes back to
    arrived_at: float = 0.0  # when it last arrived here
    ready_since: float = 0.0  # when it last became runnable (arrival or end of its last step)
    logprobs: list | None = None  # this step's token's TokenOut.logprobs entry (sampling.logprobs ≥ 0)
    route_inputs: dict | None = None  # this step's decision's inputs (sampling.route_inputs; route_inputs.py)
    grammar: GrammarState | None = None  # with sampling.grammar: its matcher here (runtime/grammar.py)
    score_prompt: bool = (
        False  # its next step scores the prompt (a new request with sampling.prompt_logprobs ≥ 0)
    )
    prompt_logprobs: list | None = None  # that step's PromptLogprobs.logprobs, until sent

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def runnable(self) -> bool:
        return self.status in (ReqStatus.WAITING, ReqStatus.RUNNING)

    def new_tokens(self) -> list[int]:
        """The tokens the engine has not run yet: the whole sequence on a first visit (prefill), the tokens
        written elsewhere on a return (extend), the last committed token otherwise (decode)."""
        return self.tokens[self.fed :]
