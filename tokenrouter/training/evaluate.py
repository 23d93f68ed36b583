"""`tokenrouter eval`: teacher-forced routing quality of a plan against baselines at equal large-model share.

Per scored position the writer is the entry (small) model, or the target of the entry rule that fires
(see `policy_view` for the supported shape). Quality of a routing = next-token accuracy of the writer's
greedy token and NLL of the true token under the writer's distribution; "gap recovered" = how much of
the small-to-large difference the routing recovers (0 = small alone, 1 = large alone).

Methods, each at the same target shares of large-model positions:
- ``policy``: the plan's own rules, sweeping one threshold param (bisection on its value);
- ``confidence`` / ``entropy``: the small model's least confident / highest-entropy positions;
- ``random``: a seeded random subset of positions;
- ``query``: whole windows, highest mean small-model entropy over the window's prompt first
  (RouteLLM-style query routing; its share moves in whole windows);
- ``divergence``: the positions where the two models' greedy tokens differ, in random order, then the
  others (a bound, not a method: a router that knows exactly where the models disagree, R2R's and CITER's
  label, but not which of them is right; below the divergence rate d it recovers share / d of the accuracy
  gap in expectation);
- ``oracle``: the positions where the large model lowers the NLL most (an upper bound, not a method).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .policy_view import PolicyViewError, context_error, fired_rule, routed_shape, threshold_node
from .teacher import TeacherConfig, TeacherData, make_windows

DEFAULT_SHARES = (0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.40, 0.50)
METHODS = ("policy", "confidence", "entropy", "random", "query", "divergence", "oracle")


@dataclass(slots=True)
class EvalConfig:
    param: str = "threshold"
    shares: tuple[float, ...] = DEFAULT_SHARES
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.shares or any(not 0 < s < 1 for s in self.shares):
            raise ValueError("shares must be fractions in (0, 1)")


def summary(share: float, rows: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """A routing's large-model share and its mean accuracy and NLL from `Scorer.per_row`'s rows."""
    acc, nll = rows
    return {"share": share, "accuracy": float(acc.mean()), "nll": float(nll.mean())}


class Scorer:
    """Quality of routings over teacher-forced data: writer per row, -1 = the entry model."""

    def __init__(self, data: TeacherData, entry: str, targets: list[str]) -> None:
        self.data, self.entry, self.targets = data, entry, targets
        self.correct = {m: data.correct(m).float() for m in data.models}
        self.small_rows = self.per_row(torch.full((data.n,), -1))
        self.large_rows = self.per_row(torch.zeros(data.n, dtype=torch.int64), [targets[0]])
        self.small = summary(0.0, self.small_rows)
        self.large = summary(1.0, self.large_rows)

    def quality(self, writer: torch.Tensor, targets: list[str] | None = None) -> dict:
        return summary(float((writer >= 0).float().mean()), self.per_row(writer, targets))

    def per_row(
        self, writer: torch.Tensor, targets: list[str] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: is the writer's greedy token right, and the writer's NLL of the true token."""
        acc = self.correct[self.entry].clone()
        nll = self.data.nll[self.entry].clone()
        for i, m in enumerate(targets or self.targets):
            mask = writer == i
            acc[mask] = self.correct[m][mask]
            nll[mask] = self.data.nll[m][mask]
        return acc, nll

    def by_window(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row values summed per window (the bootstrap's unit: rows of one window move together)."""
        nw = len(self.data.window_file)
        return torch.zeros(nw, dtype=torch.float64).index_add_(0, self.data.window, x.double())

    def resample(self, seed: int, rounds: int) -> torch.Tensor:
        """[rounds, windows] window indices drawn with replacement, the same draws for a given seed."""
        nw = len(self.data.window_file)
        return torch.randint(0, nw, (rounds, nw), generator=torch.Generator().manual_seed(seed))

    def paired(self, a: torch.Tensor, b: torch.Tensor, share: float, seed: int, rounds: int = 1000) -> dict:
        """Routing a minus routing b: accuracy and NLL differences with 95 % intervals from a bootstrap
        over windows (rows of one window move together)."""
        acc_a, nll_a = self.per_row(a)
        acc_b, nll_b = self.per_row(b)
        rows = self.by_window(torch.ones(self.data.n))
        idx = self.resample(seed, rounds)
        den = rows[idx].sum(1)
        out = {"target_share": share}
        for key, d in (("accuracy", self.by_window(acc_a - acc_b)), ("nll", self.by_window(nll_a - nll_b))):
            out[key] = float(d.sum() / rows.sum())
            out[f"{key}_ci95"] = ci95(d[idx].sum(1) / den)
        return out

    def gap_recovered_ci(self, writer: torch.Tensor, seed: int, rounds: int = 1000) -> dict:
        """95 % intervals of the share of the accuracy and NLL gaps that a routing recovers, from a bootstrap
        over windows: numerator (routed minus small) and denominator (large minus small) are resampled
        together, so the interval includes the uncertainty of the gap itself."""
        acc, nll = self.per_row(writer)
        (acc_s, nll_s), (acc_l, nll_l) = self.small_rows, self.large_rows
        idx = self.resample(seed, rounds)
        out = {}
        for key, num, den in (
            ("acc_gap_recovered_ci95", self.by_window(acc - acc_s), self.by_window(acc_l - acc_s)),
            ("nll_gap_recovered_ci95", self.by_window(nll_s - nll), self.by_window(nll_s - nll_l)),
        ):
            d = den[idx].sum(1)
            ok = d != 0
            out[key] = ci95(num[idx].sum(1)[ok] / d[ok]) if bool(ok.any()) else None
        return out

    def point(self, writer: torch.Tensor, **extra) -> dict:
        q = self.quality(writer)
        d_acc = self.large["accuracy"] - self.small["accuracy"]
        d_nll = self.small["nll"] - self.large["nll"]
        q["acc_gap_recovered"] = (q["accuracy"] - self.small["accuracy"]) / d_acc if d_acc else None
        q["nll_gap_recovered"] = (self.small["nll"] - q["nll"]) / d_nll if d_nll else None
        q.update(extra)
        return q


def ci95(draws: torch.Tensor) -> list[float]:
    """The 2.5 % and 97.5 % points of bootstrap draws."""
    boot = draws.sort().values
    k = boot.numel()
    return [float(boot[int(0.025 * k)]), float(boot[int(0.975 * k) - 1])]


def top_share(score: torch.Tensor, share: float) -> torch.Tensor:
    """Writer vector routing the round(share * N) rows of highest score to target 0."""
    k = round(share * score.numel())
    writer = torch.full(score.shape, -1, dtype=torch.int64)
    writer[torch.argsort(score, descending=True, stable=True)[:k]] = 0
    return writer


def query_routing(data: TeacherData, share: float) -> torch.Tensor:
    rows = torch.bincount(data.window, minlength=len(data.window_file))
    order = torch.argsort(data.prompt_entropy, descending=True, stable=True)
    cum = torch.cumsum(rows[order], 0)
    want = share * data.n
    k = int(torch.searchsorted(cum, torch.tensor(want)).item())
    # the prefix of whole windows whose share is closest to the target
    if k < len(cum) and k > 0 and abs(float(cum[k - 1]) - want) < abs(float(cum[k]) - want):
        k -= 1
    chosen = torch.zeros(len(rows), dtype=torch.bool)
    chosen[order[: k + 1]] = True
    return torch.where(chosen[data.window], 0, -1)


def policy_values(plan: dict, entry: str, data: TeacherData, seed: int) -> dict[str, torch.Tensor]:
    from tokenrouter.runtime.rng import STREAM_UNIFORM, uniform
    from tokenrouter.runtime.route.routers import RouterSpec, load_router

    values = dict(data.features)
    pos = data.features["position"] - 1  # the index of the token being sampled
    values["uniform"] = uniform(torch.full_like(pos, seed), pos, STREAM_UNIFORM, torch.zeros_like(pos))
    for name in plan["routes"][entry]["routers"]:
        spec = RouterSpec.from_plan(name, plan["routers"][name])
        router, _ = load_router(spec, None, "cpu")
        with torch.no_grad():
            values[name] = router(data.router_inputs[name])
    return values


def compared_range(ir: dict, values: dict, n: int, node: int) -> tuple[float, float]:
    """The extremes over the n rows of the value that the const `node` is compared with, widened by 1e-6: a
    threshold at one end fires the comparison on every row, at the other on none."""
    from .policy_view import eval_ir

    cmp = next(x for x in ir["nodes"] if x["op"] in ("lt", "le", "gt", "ge") and node in x["args"])
    other = cmp["args"][0] if cmp["args"][1] == node else cmp["args"][1]
    score = eval_ir(ir, values, n)[other].float()
    return float(score.min()) - 1e-6, float(score.max()) + 1e-6


def bisect_share(
    share_of, lo: float, hi: float, target: float, iterations: int, stuck: str
) -> tuple[float, float, dict[float, float]]:
    """Bisection of a threshold v in [lo, hi] for `share_of(v)` (monotone in v) to reach `target`: the final
    bracket (a, b) and the share at every v tried, in order. PolicyViewError "`stuck` (stays S)" when the
    share is the same at both ends."""
    tried = {lo: share_of(lo), hi: share_of(hi)}
    if tried[lo] == tried[hi]:
        raise PolicyViewError(f"{stuck} (stays {tried[lo]:.3f})")
    increasing = tried[hi] > tried[lo]
    a, b = lo, hi
    for _ in range(iterations):
        mid = (a + b) / 2
        tried[mid] = share_of(mid)
        if (tried[mid] < target) == increasing:
            a = mid
        else:
            b = mid
    return a, b, tried


def threshold_for_share(
    ir: dict, values: dict, n: int, node: int, target: float, bounds: tuple[float, float] | None = None
) -> tuple[float, float, torch.Tensor]:
    """(threshold, the share reached, the fired rule per row, -1 = stay): the value of the const `node` (a
    threshold, one side of one comparison) at which the route IR's rules fire on about `target` of the n
    rows, by bisection between the compared value's extremes (`bounds`: `compared_range`, computed here if
    None). PolicyViewError when the share does not move with the threshold."""

    def share_at(v: float) -> float:
        return float((fired_rule(ir, values, n, {node: v}) >= 0).float().mean())

    lo, hi = bounds or compared_range(ir, values, n, node)
    stuck = "the large-model share does not move with the swept threshold"
    a, b, tried = bisect_share(share_at, lo, hi, target, 40, stuck)
    best = min((a, b), key=lambda v: abs(tried[v] - target))
    writer = fired_rule(ir, values, n, {node: best})
    return best, tried[best], writer


def sweep_policy(
    plan: dict, entry: str, values: dict, n: int, node: int, shares, scorer: Scorer
) -> list[dict]:
    ir = plan["routes"][entry]
    bounds = compared_range(ir, values, n, node)
    out = []
    for target in shares:
        best, _, writer = threshold_for_share(ir, values, n, node, target, bounds)
        out.append((scorer.point(writer, target_share=target, threshold=best), writer))
    return out


def teacher_force_plan(
    plan: dict, data_dir: Path, teacher: TeacherConfig, cache: Path | None = None
) -> tuple[TeacherData, list]:
    """A routed policy's teacher-forced rows over the text files in `data_dir` (the entry model, every
    target model, the routers' inputs; `cache`: feature_cache.py), and the windows they come from."""
    from tokenrouter.runtime.route.routers import RouterSpec

    from .feature_cache import teacher_force_cached

    shape = routed_shape(plan)
    entry = shape.entry
    models = [entry, *dict.fromkeys(t for t in shape.targets if t != entry)]
    specs = {r: RouterSpec.from_plan(r, plan["routers"][r]) for r in shape.ir["routers"]}
    windows = make_windows(data_dir, Path(plan["models"][entry]["path"]), teacher)
    data, _ = teacher_force_cached(cache, plan, entry, models, windows, teacher, specs)
    return data, windows


def evaluate(
    plan: dict,
    data_dir: Path,
    teacher: TeacherConfig,
    cfg: EvalConfig,
    cache: Path | None = None,
    versus: dict | None = None,
) -> dict:
    """``cache``: a folder that keeps the teacher-forced rows between runs (feature_cache.py); the rows
    hold the routers' inputs, not their outputs, so one entry serves every router file of a policy.
    ``versus``: the same policy with other param values (e.g. another router file), swept the same way
    and compared paired at each share ("policy minus versus": one bootstrap over the same windows, so
    the interval is the one of the difference, not of two separate figures)."""
    shape = routed_shape(plan)
    entry, ir = shape.entry, shape.ir
    node = threshold_node(plan, ir, cfg.param)
    _check_settings(plan, [entry, *shape.targets], teacher, cache)
    data, windows = teacher_force_plan(plan, data_dir, teacher, cache)
    scorer = Scorer(data, entry, shape.targets)
    values = policy_values(plan, entry, data, cfg.seed)
    n = data.n
    rand_score = torch.rand(n, generator=torch.Generator().manual_seed(cfg.seed))
    differ = (data.greedy[entry] != data.greedy[shape.targets[0]]).float()
    curves: dict[str, list[dict]] = {m: [] for m in METHODS}
    swept = sweep_policy(plan, entry, values, n, node, cfg.shares, scorer)
    curves["policy"] = [p for p, _ in swept]
    minus: dict[str, list[dict]] = {"confidence": [], "entropy": []}
    if versus is not None:
        curves["versus"], minus["versus"] = _versus(plan, versus, entry, data, cfg, scorer, swept)
    scores = {
        "random": rand_score,
        "divergence": differ + 0.5 * rand_score,  # every differing position first, in random order
        "oracle": data.nll[entry] - data.nll[shape.targets[0]],
    }
    _baselines(data, cfg, scorer, swept, scores, curves, minus)
    own = scorer.point(fired_rule(ir, values, n), threshold=plan["params"][cfg.param]["value"])
    return {
        "policy": plan["policy"]["name"],
        "data": str(data_dir),
        "param": cfg.param,
        "tokens": n,
        "windows": len(windows),
        "files": len(set(data.window_file)),
        "models": {"small": entry, "large": shape.targets[0]},
        "small": scorer.small,
        "large": scorer.large,
        "label_rate": float(differ.mean()),
        "at_plan_threshold": own,
        "curves": curves,
        "policy_minus": minus,
    }


def _check_settings(plan: dict, models: list[str], teacher: TeacherConfig, cache: Path | None) -> None:
    """Before the teacher forcing, which would fail on them only after minutes of it: the cache folder and the
    models' context."""
    from .settings import TrainSettingsError, folder_problem

    problem = (folder_problem(cache, "--cache") if cache is not None else None) or context_error(
        plan, teacher.seq_len, f"--seq-len {teacher.seq_len}", models
    )
    if problem:
        raise TrainSettingsError(problem)


def _versus(plan: dict, versus: dict, entry: str, data: TeacherData, cfg: EvalConfig, scorer: Scorer,
            swept: list) -> tuple[list[dict], list[dict]]:  # fmt: skip
    """The `versus` policy's curve, and the policy minus it at each share (paired)."""
    same_inputs = all(
        versus["routers"][r]["inputs"] == plan["routers"].get(r, {}).get("inputs")
        for r in versus["routes"][versus["entry"]]["routers"]
    )
    if routed_shape(versus).entry != entry or versus["models"] != plan["models"] or not same_inputs:
        raise PolicyViewError(
            "--versus may change params that leave the models and the routers' inputs as they are "
            "(e.g. a router file), not those"
        )
    other_node = threshold_node(versus, versus["routes"][entry], cfg.param)
    other_values = policy_values(versus, entry, data, cfg.seed)
    other = sweep_policy(versus, entry, other_values, data.n, other_node, cfg.shares, scorer)
    for p, w_other in other:
        p.update(scorer.gap_recovered_ci(w_other, cfg.seed))
    minus = [scorer.paired(w, w_other, s, cfg.seed) for (_, w), (_, w_other), s in
             zip(swept, other, cfg.shares, strict=True)]  # fmt: skip
    return [p for p, _ in other], minus


def _baselines(data: TeacherData, cfg: EvalConfig, scorer: Scorer, swept: list, scores: dict, curves: dict,
               minus: dict) -> None:  # fmt: skip
    """At each share: the policy's interval, each baseline's point (`scores`: random, divergence, oracle, ranked
    by top share), and the policy minus confidence and entropy (paired), into `curves` and `minus`."""
    f = data.features
    for (point, w_policy), s in zip(swept, cfg.shares, strict=True):
        point.update(scorer.gap_recovered_ci(w_policy, cfg.seed))
        w_conf, w_ent = top_share(-f["confidence"], s), top_share(f["entropy"], s)
        curves["confidence"].append(scorer.point(w_conf, target_share=s))
        curves["entropy"].append(scorer.point(w_ent, target_share=s))
        curves["random"].append(scorer.point(top_share(scores["random"], s), target_share=s))
        curves["query"].append(scorer.point(query_routing(data, s), target_share=s))
        curves["divergence"].append(scorer.point(top_share(scores["divergence"], s), target_share=s))
        curves["oracle"].append(scorer.point(top_share(scores["oracle"], s), target_share=s))
        minus["confidence"].append(scorer.paired(w_policy, w_conf, s, cfg.seed))
        minus["entropy"].append(scorer.paired(w_policy, w_ent, s, cfg.seed))


def format_table(result: dict) -> str:
    s, lg = result["small"], result["large"]
    lines = [
        f"policy {result['policy']}: {result['tokens']} positions in {result['windows']} windows of "
        f"{result['files']} files ({result['data']})",
        f"small {result['models']['small']}: accuracy {s['accuracy']:.4f}  NLL {s['nll']:.4f}",
        f"large {result['models']['large']}: accuracy {lg['accuracy']:.4f}  NLL {lg['nll']:.4f}",
        f"positions where the greedy tokens differ: {result['label_rate']:.3f}",
        "",
        *_gap_tables(result),
        *_policy_intervals(result["curves"]["policy"]),
        *_minus_tables(result.get("policy_minus", {})),
    ]
    own = result["at_plan_threshold"]
    lines.append(
        f"at the plan's {result['param']} = {own['threshold']}: large share {own['share']:.3f}, accuracy "
        f"{own['accuracy']:.4f}, NLL {own['nll']:.4f}"
    )
    lines.append("* = actual share more than 0.01 from the target (query routing moves in whole windows)")
    return "\n".join(lines)


def _gap_tables(result: dict) -> list[str]:
    """Accuracy and NLL (gap recovered) of every method at each target share, one table each."""
    methods = METHODS + (("versus",) if "versus" in result["curves"] else ())
    lines = []
    for metric, key in (("accuracy", "acc_gap_recovered"), ("NLL", "nll_gap_recovered")):
        lines.append(f"{metric} (gap recovered) at equal large-model share:")
        lines.append(f"{'share':>6} " + " ".join(f"{m:>17}" for m in methods))
        for i, target in enumerate(result["curves"]["policy"]):
            cells = [_cell(result["curves"][m][i], metric, key) for m in methods]
            lines.append(f"{target['target_share']:6.2f} " + " ".join(f"{c:>17}" for c in cells))
        lines.append("")
    return lines


def _cell(p: dict, metric: str, key: str) -> str:
    v = p["accuracy"] if metric == "accuracy" else p["nll"]
    g = p[key]
    gtxt = f"{100 * g:5.1f}%" if g is not None else "   - "
    star = "*" if abs(p["share"] - p["target_share"]) > 0.01 else " "
    return f"{v:.4f} ({gtxt}){star}"


def _policy_intervals(points: list[dict]) -> list[str]:
    """The policy's gap recovered with its bootstrap interval at each share (none without intervals)."""
    if not all("acc_gap_recovered_ci95" in p for p in points):
        return []
    lines = ["policy's gap recovered (95 % bootstrap interval over windows):"]
    for p in points:
        a, n = p["acc_gap_recovered_ci95"], p["nll_gap_recovered_ci95"]
        if a is None or n is None:
            continue
        lines.append(
            f"  share {p['target_share']:.2f}: accuracy {100 * p['acc_gap_recovered']:.1f} % "
            f"[{100 * a[0]:.1f}, {100 * a[1]:.1f}], NLL {100 * p['nll_gap_recovered']:.1f} % "
            f"[{100 * n[0]:.1f}, {100 * n[1]:.1f}]"
        )
    return [*lines, ""]


def _minus_tables(minus: dict) -> list[str]:
    """The policy minus each baseline, paired, with its bootstrap interval at each share."""
    lines = []
    for base, rows in minus.items():
        lines.append(f"policy minus {base} (95 % bootstrap interval over windows):")
        for r in rows:
            a, n = r["accuracy_ci95"], r["nll_ci95"]
            lines.append(
                f"  share {r['target_share']:.2f}: accuracy {100 * r['accuracy']:+.2f} points "
                f"[{100 * a[0]:+.2f}, {100 * a[1]:+.2f}], NLL {r['nll']:+.4f} [{n[0]:+.4f}, {n[1]:+.4f}]"
            )
        lines.append("")
    return lines


def plot(result: dict, path: Path) -> None:
    from tokenrouter.plotting import figure

    with figure(path, (7, 4.6), dpi=110) as (_, ax):
        _draw(ax, result)


_STYLES = {
    "policy": "o-",
    "confidence": "s--",
    "entropy": "^--",
    "random": "x:",
    "query": "d:",
    "divergence": "+",
    "oracle": ".",
}


def _draw(ax, result: dict) -> None:
    for m in METHODS:
        pts = result["curves"][m]
        label = f"{m} ({result['policy']})" if m == "policy" else m
        ax.plot(
            [100 * p["share"] for p in pts],
            [100 * p["accuracy"] for p in pts],
            _STYLES[m],
            label=label,
            alpha=0.5 if m in ("divergence", "oracle") else 1.0,
        )
    ax.axhline(100 * result["small"]["accuracy"], color="grey", ls="--", lw=0.8)
    ax.axhline(100 * result["large"]["accuracy"], color="black", ls="--", lw=0.8)
    for key in ("small", "large"):
        ax.text(0.99, 100 * result[key]["accuracy"], f"{key} alone ", va="bottom", ha="right", fontsize=8,
                transform=ax.get_yaxis_transform())  # fmt: skip
    ax.set_xlabel("large-model share of tokens (%)")
    ax.set_ylabel("next-token accuracy of the routed prediction (%)")
    ax.set_title(f"Teacher-forced routing quality, {result['tokens']} held-out positions")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
