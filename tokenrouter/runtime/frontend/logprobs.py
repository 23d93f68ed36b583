"""Log-probabilities in OpenAI's two shapes: completions (`tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`) and chat (`content`: a list of `{token, logprob, bytes, top_logprobs}`). Each value is from the
model that wrote the token (the routing trace names it), under the log-softmax of the logits it sampled the
token from: the model's own distribution, before temperature, top-k and top-p (as OpenAI and vLLM report)."""

from __future__ import annotations

from tokenrouter.runtime.frontend.codec import TextCodec


def _text(codec: TextCodec, tid: int) -> str:
    return codec.tokenizer.decode([tid], skip_special_tokens=False)


def completion_logprobs(codec: TextCodec, entries: list, offset: int = 0) -> dict:
    """`entries`: (token id, log-probability, [[id, log-probability], ...]) per token, in order; `offset`: the
    length of the text before the first of them (for `text_offset`)."""
    tokens, offsets = [], []
    for tid, _, _ in entries:
        offsets.append(offset)
        tokens.append(_text(codec, tid))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, lp, _ in entries],
        "top_logprobs": [{_text(codec, t): v for t, v in top} for _, _, top in entries],
        "text_offset": offsets,
    }


def chat_logprobs(codec: TextCodec, entries: list) -> dict:
    def one(tid: int, lp: float) -> dict:
        text = _text(codec, tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [{**one(tid, lp), "top_logprobs": [one(t, v) for t, v in top]} for tid, lp, top in entries]
    }
