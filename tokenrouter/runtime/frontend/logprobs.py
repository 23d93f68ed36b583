"""Log-probabilities in OpenAI's two shapes: completions (`tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`) and chat (`content`: a list of `{token, logprob, bytes, top_logprobs}`). Each value is from the
model that wrote the token (the routing trace names it), under the log-softmax of the logits it sampled the
token from: the model's own distribution, before temperature, top-k and top-p (as OpenAI and vLLM report).
With `as_ids` (the request's `return_tokens_as_token_ids`, vLLM's extension) a token is named `token_id:N`
instead of by its text: a name for every token, where texts may be equal or not valid UTF-8 on their own."""

from __future__ import annotations

from tokenrouter.runtime.frontend.codec import TextCodec


def token_text(codec: TextCodec, tid: int) -> str:
    return codec.tokenizer.decode([tid], skip_special_tokens=False)


def _name(codec: TextCodec, tid: int, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else token_text(codec, tid)


def completion_logprobs(codec: TextCodec, entries: list, offset: int = 0, as_ids: bool = False) -> dict:
    """`entries`: (token id, log-probability, [[id, log-probability], ...]) per token, in order (an echoed
    prompt's first token: (id, None, None), nothing to condition on); `offset`: the length of the text before
    the first of them (for `text_offset`, which counts the tokens' texts)."""
    tokens, offsets = [], []
    for tid, _, _ in entries:
        offsets.append(offset)
        text = token_text(codec, tid)
        tokens.append(f"token_id:{tid}" if as_ids else text)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, lp, _ in entries],
        "top_logprobs": [
            None if top is None else {_name(codec, t, as_ids): v for t, v in top} for _, _, top in entries
        ],
        "text_offset": offsets,
    }


def chat_logprobs(codec: TextCodec, entries: list, as_ids: bool = False) -> dict:
    def one(tid: int, lp: float) -> dict:
        text = token_text(codec, tid)
        return {"token": _name(codec, tid, as_ids), "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [{**one(tid, lp), "top_logprobs": [one(t, v) for t, v in top]} for tid, lp, top in entries]
    }
