"""An independent, plain-Python evaluation of a route IR (docs/ir.md) for one row at a time, over Python
floats: the statistics, the sampled token (the RNG formula per vocabulary entry), and the rules. The
kernels are tested against this; it shares no code with them beyond `rng.uniform_int`."""

from __future__ import annotations

import math

from tokenrouter.runtime.rng import STREAM_CHUNK, STREAM_SAMPLE, STREAM_UNIFORM, U_MAX, U_MIN, uniform_int

SAMPLE_CHUNK = 2048  # docs/ir.md, "Randomness" (written out here, not imported)
SAMPLE_GROUP = 8  # the "strided" sampler's ids per chunk and span
STREAM_GROUP = 3
DEFAULT_SAMPLER = "strided"  # runtime.sampling.DEFAULT_SAMPLER, written out (test_route_sampling checks it)

INF = math.inf


def row_stats(row: list[float]) -> dict[str, float]:
    live = [v for v in row if v != -INF]
    m = max(live)
    s = sum(math.exp(v - m) for v in live)
    probs = [math.exp(v - m) / s for v in live]
    top = sorted(live, reverse=True)
    p2 = math.exp(top[1] - m) / s if len(top) > 1 else 0.0
    # in shifted form (v - m): at |logits| ~ 1e38 an unshifted log-sum-exp loses everything to rounding
    entropy = max(math.log(s) - sum(p * (v - m) for p, v in zip(probs, live, strict=True) if p > 0), 0.0)
    return {
        "max": m,
        "log_s": math.log(s),
        "confidence": 1.0 / s,
        "margin": 1.0 / s - p2,
        "entropy": entropy,
        "norm_entropy": entropy / math.log(len(row)),
    }


def gumbel_noise(seed: int, position: int, stream: int, index: int) -> float:
    return -math.log(-math.log(min(max(uniform_int(seed, position, stream, index), U_MIN), U_MAX)))


def sample_row(
    row: list[float],
    seed: int,
    position: int,
    temperature: float,
    top_k: int,
    top_p: float,
    sampler: str = DEFAULT_SAMPLER,
) -> int:
    vocab = len(row)
    if temperature == 0:
        best = max(row)
        return row.index(best)  # lowest index among ties
    cand = list(range(vocab))
    scaled = [v / temperature for v in row]
    if top_k > 0:
        cand = sorted(cand, key=lambda i: (-row[i], i))[:top_k]
    if top_p < 1:
        order = sorted(cand, key=lambda i: (-scaled[i], i))
        mx = scaled[order[0]]
        weights = [math.exp(scaled[i] - mx) if scaled[i] != -INF else 0.0 for i in order]
        total = sum(weights)
        kept, mass = [], 0.0
        for i, w in zip(order, weights, strict=True):
            if kept and mass >= top_p:
                break
            kept.append(i)
            mass += w / total
        cand = kept
    if sampler == "strided":
        return _strided_draw(scaled, cand, seed, position)
    # stage 1: the chunk of SAMPLE_CHUNK ids, from the cumulative chunk masses and the stream-2 draw
    mx = max(scaled[i] for i in cand)
    n_chunks = -(-vocab // SAMPLE_CHUNK)
    mass = [0.0] * n_chunks
    for i in cand:
        if scaled[i] != -INF:
            mass[i // SAMPLE_CHUNK] += math.exp(scaled[i] - mx)
    target = uniform_int(seed, position, STREAM_CHUNK, 0) * sum(mass)
    cum, chosen = 0.0, None
    for c, w in enumerate(mass):
        cum += w
        if cum > target:
            chosen = c
            break
    if chosen is None:
        chosen = max(c for c, w in enumerate(mass) if w > 0)
    return _gumbel_max(scaled, [i for i in cand if i // SAMPLE_CHUNK == chosen], seed, position)


def _gumbel_max(scaled: list[float], ids: list[int], seed: int, position: int) -> int:
    """Stage 2 of both samplers: Gumbel-max over `ids` (ties: the lowest id)."""
    best, best_i = -INF, None
    for i in sorted(ids):
        score = scaled[i] + gumbel_noise(seed, position, STREAM_SAMPLE, i)
        if best_i is None or score > best:
            best, best_i = score, i
    return best_i


def _strided_draw(scaled: list[float], cand: list[int], seed: int, position: int) -> int:
    """The "strided" sampler: chunk j = the ids with (v mod SAMPLE_CHUNK) // SAMPLE_GROUP == j, chosen by
    Gumbel-max over log(mass) (stream 3, index j), then Gumbel-max within it."""
    mx = max(scaled[i] for i in cand)
    groups = SAMPLE_CHUNK // SAMPLE_GROUP
    mass = [0.0] * groups
    for i in cand:
        if scaled[i] != -INF:
            mass[(i % SAMPLE_CHUNK) // SAMPLE_GROUP] += math.exp(scaled[i] - mx)
    best, chosen = -INF, None
    for j, w in enumerate(mass):
        if w > 0:
            score = math.log(w) + gumbel_noise(seed, position, STREAM_GROUP, j)
            if chosen is None or score > best:
                best, chosen = score, j
    return _gumbel_max(
        scaled, [i for i in cand if (i % SAMPLE_CHUNK) // SAMPLE_GROUP == chosen], seed, position
    )


def _div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(INF, a) * math.copysign(1.0, b)
    return a / b


def _log(a: float) -> float:
    if math.isnan(a) or a < 0:
        return math.nan
    return -INF if a == 0 else math.log(a)


def _exp(a: float) -> float:
    try:
        return math.exp(a)
    except OverflowError:
        return INF


def _minmax(fn, a, b):
    if isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b):
        return math.nan
    return fn(a, b)


def eval_rules(ir: dict, feats: dict, routers: dict[str, float], uniform: float) -> int:
    vals: list = []
    for n in ir["nodes"]:
        op, typ = n["op"], n["type"]
        a = [vals[i] for i in n.get("args", [])]
        if typ == "float" or op in ("div", "log", "exp", "sigmoid"):
            a = [float(x) if not isinstance(x, bool) else x for x in a]
        elif any(isinstance(x, float) for x in a):
            a = [float(x) for x in a]
        if op == "const":
            v = n["value"]
        elif op == "feature":
            v = feats[n["name"]]
        elif op == "router":
            v = routers[n["name"]]
        elif op == "uniform":
            v = uniform
        elif op == "add":
            v = a[0] + a[1]
        elif op == "sub":
            v = a[0] - a[1]
        elif op == "mul":
            v = a[0] * a[1]
        elif op == "div":
            v = _div(a[0], a[1])
        elif op == "neg":
            v = -a[0]
        elif op in ("lt", "le", "gt", "ge", "eq", "ne"):
            x, y = a
            v = {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[op]
        elif op == "and":
            v = a[0] and a[1]
        elif op == "or":
            v = a[0] or a[1]
        elif op == "not":
            v = not a[0]
        elif op == "min":
            v = _minmax(min, a[0], a[1])
        elif op == "max":
            v = _minmax(max, a[0], a[1])
        elif op == "abs":
            v = abs(a[0])
        elif op == "log":
            v = _log(a[0])
        elif op == "exp":
            v = _exp(a[0])
        elif op == "sigmoid":
            v = 1.0 / (1.0 + _exp(-a[0]))
        else:
            raise AssertionError(f"unknown op {op}")
        vals.append(v)
    for j, rule in enumerate(ir["rules"]):
        if rule["cond"] is None or vals[rule["cond"]]:
            return j
    return -1


def reference(ir: dict, logits, state, router_out=None, sampler: str = DEFAULT_SAMPLER) -> list[dict]:
    """Per row: token, logprob, rule and the features, from tensors (logits [B, V]; state: RouteBatchState)."""
    rows = []
    x = logits.float().tolist()
    for b, row in enumerate(x):
        seed = int(state.seed[b]) & (2**64 - 1)
        pos = int(state.position[b])
        tok = sample_row(
            row, seed, pos, float(state.temperature[b]), int(state.top_k[b]), float(state.top_p[b]), sampler
        )
        st = row_stats(row)
        feats = {k: st[k] for k in ("confidence", "margin", "entropy", "norm_entropy")}
        feats.update(
            token=tok,
            logprob=(row[tok] - st["max"]) - st["log_s"],
            run_length=int(state.run_length[b]) + 1,
            generated=int(state.generated[b]) + 1,
            position=pos + 1,
        )
        routers = {}
        if router_out is not None:
            routers = {name: float(router_out[b, i]) for i, name in enumerate(ir["routers"])}
        u = uniform_int(seed, pos, STREAM_UNIFORM, 0)
        rows.append({"token": tok, "logprob": feats["logprob"], "rule": eval_rules(ir, feats, routers, u),
                     "features": feats, "uniform": u})  # fmt: skip
    return rows
