"""`tokenrouter train-router`: fit a plan's router to teacher-forced labels from the small and large model.

Labels (``--label``; the router only ever reads the small model's inputs the policy declares, the label
uses the true next token at training time only, as CITER's reward does):

- ``divergence`` (default): the entry (small) model's greedy token differs from the large model's (R2R's
  and CITER's notion). Binary; BCE with positive-class weighting; the output is a logit.
- ``gain``: regression on what handing the position to the large model gains on the quality metrics of
  ``tokenrouter eval``: (correct_large - correct_small) / d_acc + (NLL_small - NLL_large) / d_nll, where
  d_acc and d_nll are the large model's mean advantages over the training rows (so a routing's summed
  gain is its accuracy-gap plus NLL-gap recovered, times the row count). Mean squared error; the
  output estimates the expected gain of the position, and a threshold on it ranks positions by it.
- ``nll-gain``: regression on NLL_small - NLL_large alone (nats; the output is the expected NLL gain).
- ``expected-gain``: the ``gain`` label with the true next token averaged out under the large model's
  distribution p_L: (p_L(large greedy) - p_L(small greedy)) / d_acc + KL(p_L || p_small) / d_nll (same
  d_acc, d_nll as ``gain``, from the realized gains). Where p_L is the text's true next-token
  distribution, its conditional mean given the router's inputs is the gain label's, but a position's
  value no longer depends on which token happened to follow, so far less of it is noise. Uses the
  large model's distribution at training time only. Mean squared error.
- ``top-share``: tied to the share the router is meant to route (``--top-share``, default 0.25): 1 where
  the position's ``gain`` (above) is among the top share of the training rows' gains, else 0. Binary;
  BCE with positive-class weighting; the output is a logit of "this position is one of the best ones to
  hand over". It ignores how far above or below the cut a position's gain is, so a handful of extreme
  gains cannot dominate the fit as they do under mean squared error.

Loss (``--loss``): ``auto`` is BCE for the binary labels and mean squared error for the real-valued ones.
``pairwise`` ranks instead of fitting values: each training row is paired with another of its batch, and
the loss is |y_i - y_j| * log(1 + exp(-sign(y_i - y_j) * (s_i - s_j))) on the router outputs s. Its
minimiser orders positions by the conditional mean of the label (for a pair of inputs it sets s - s' to
log(E[(y - y')+] / E[(y' - y)+]), whose sign is that of E[y] - E[y']), as mean squared error does, but it
grows linearly, not quadratically, with a label far from the prediction, and only the order of the
outputs is trained (the output's scale and offset are arbitrary: set the threshold from the printed sweep).

Ensembles (``--ensemble N``): N routers trained on the same rows and split, with seeds seed + 1000 i for
their initial weights and batches (member 0 is the plain run), written as one router of the same layout
whose output is their mean (``merge_ensemble``: N times the hidden units).

Whether the router's output should be high or low on positions worth routing is read from the policy
itself: the rule that reads the router is evaluated with the router pinned high and low, and the router
is trained so that a high label makes that rule fire more. Training: AdamW, early stopping on a
held-out split by file; the file keeps the best epoch, with input_mean/input_std (docs/ir.md "Router
weights").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .feature_cache import teacher_force_cached
from .policy_view import PolicyViewError, fired_rule, routed_shape
from .settings import TrainSettingsError, folder_problem, output_problem
from .teacher import TeacherConfig, TeacherData, make_windows

LABELS = ("divergence", "gain", "nll-gain", "expected-gain", "top-share")
BINARY_LABELS = ("divergence", "top-share")
LOSSES = ("auto", "pairwise")
# the most weights a router may have (float32: 200 MB, several times that while AdamW trains it); the routers
# of the examples have D x 256 (about 10^5)
MAX_ROUTER_WEIGHTS = 50_000_000


def router_size_problem(
    plan: dict, router: str, hidden_layers: tuple[int, ...], hidden_size: int | None = None, members: int = 1
) -> str | None:
    """The message when an mlp router `router` of `plan` with these hidden layers (`members` of them side by
    side: an ensemble) would have more than MAX_ROUTER_WEIGHTS weights, else None (also where its input width
    cannot be known yet: the command that builds it says why)."""
    width = _mlp_input_width(plan, router, hidden_size)
    if width is None:
        return None
    sizes = [width, *hidden_layers, 1]
    weights = members * sum(a * b + b for a, b in zip(sizes, sizes[1:], strict=False))
    if weights <= MAX_ROUTER_WEIGHTS:
        return None
    shape = " -> ".join(map(str, sizes))
    return (
        f"--hidden-layers {','.join(map(str, hidden_layers))}: router {router!r} ({shape}"
        + (f", {members} members" if members > 1 else "")
        + f") would have {weights:.3g} weights, more than {MAX_ROUTER_WEIGHTS:.0e}"
    )


def _mlp_input_width(plan: dict, router: str, hidden_size: int | None) -> int | None:
    """The input width of the plan's mlp router `router`; None for another kind, or where it cannot be known
    yet."""
    from tokenrouter.runtime.route.routers import RouterSpec, model_hidden_size

    try:
        spec = RouterSpec.from_plan(router, (plan.get("routers") or {})[router])
        if spec.kind != "mlp":
            return None
        if hidden_size is None and spec.hidden_inputs:
            hidden_size = model_hidden_size(plan["models"][spec.inputs[0].model]["path"])
            if hidden_size is None:
                return None
    except (KeyError, TypeError, ValueError):
        return None
    return spec.width(hidden_size or 0)


@dataclass(slots=True)
class RouterTrainConfig:
    label: str = "divergence"  # one of LABELS
    loss: str = "auto"  # one of LOSSES
    top_share: float = 0.25  # top-share label: the share of training rows labelled 1
    ensemble: int = 1  # members averaged into one router (merge_ensemble)
    hidden_layers: tuple[int, ...] = (256,)  # mlp only
    epochs: int = 30
    batch: int = 512
    lr: float = 2e-3
    weight_decay: float = 1e-4
    val_frac: float = 0.15  # of files
    seed: int = 0

    def __post_init__(self) -> None:
        if self.label not in LABELS:
            raise ValueError(f"unknown label {self.label!r}; expected one of {', '.join(LABELS)}")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; expected one of {', '.join(LOSSES)}")
        if not 0 < self.top_share < 1:
            raise ValueError(f"top_share must be in (0, 1), got {self.top_share}")
        if any(h < 1 for h in self.hidden_layers):
            raise ValueError("hidden layer sizes must be >= 1")
        if self.epochs < 1 or self.batch < 1 or self.ensemble < 1:
            raise ValueError("epochs, batch and ensemble must be >= 1")
        if not 0 < self.lr < 1:
            raise ValueError("lr must be in (0, 1)")
        if not 0 < self.val_frac < 1:
            raise ValueError("val_frac must be in (0, 1)")


@dataclass(slots=True)
class RouterReport:
    path: str
    label: str
    rows_train: int
    rows_val: int
    positive_rate: float  # share of val positions where small greedy != large greedy (every label)
    polarity: int  # +1: a high router output fires the rule; -1: a low one does
    val_loss: float  # on the val split: BCE (binary labels), mean squared error (gain labels) or pairwise
    precision: float  # at the plan's threshold, on the val split: of the routed positions, divergent ones
    recall: float  # of the divergent positions, routed ones
    routed_share: float
    threshold_text: str
    acc_gap_recovered: float | None  # at the plan's threshold, on the val split
    nll_gap_recovered: float | None
    sweep: list[dict]  # on the val split: the swept param's value per target share, with the gaps recovered
    loss: str = "auto"
    cache: str = "off"  # teacher-forced rows: 'off', 'hit PATH' or 'wrote PATH' (feature_cache.py)


def router_rule(plan: dict, router: str) -> tuple[str, int, str]:
    """(entry model, index of the entry rule that reads `router`, large model that rule targets)."""
    shape = routed_shape(plan)
    if router not in (plan.get("routers") or {}):
        known = ", ".join(sorted(plan.get("routers") or {})) or "none"
        raise PolicyViewError(f"the policy has no router {router!r} (routers: {known})")
    spec = plan["routers"][router]
    if spec["model"] != shape.entry:
        raise PolicyViewError(
            f"router {router!r} reads model {spec['model']!r}, not the entry model {shape.entry!r}"
        )
    nodes = shape.ir["nodes"]
    reads = {i for i, n in enumerate(nodes) if n["op"] == "router" and n["name"] == router}
    rules = [
        i
        for i, r in enumerate(shape.ir["rules"])
        if r["cond"] is not None and _reaches(nodes, r["cond"], reads)
    ]
    if not rules:
        raise PolicyViewError(f"no rule of {shape.entry!r} reads router {router!r}")
    return shape.entry, rules[0], shape.targets[rules[0]]


def _reaches(nodes: list[dict], idx: int, targets: set[int]) -> bool:
    """Whether IR node `idx` is one of `targets` or reads one, through its arguments."""
    stack, seen = [idx], set()
    while stack:
        i = stack.pop()
        if i in targets:
            return True
        if i not in seen:
            seen.add(i)
            stack.extend(nodes[i].get("args", []))
    return False


def polarity(plan: dict, entry: str, router: str, rule: int, data: TeacherData) -> int:
    ir = plan["routes"][entry]
    n = min(data.n, 4096)
    values = {k: v[:n] for k, v in data.features.items()}
    values["uniform"] = torch.rand(n, generator=torch.Generator().manual_seed(0))
    others = {r: torch.zeros(n) for r in ir["routers"]}
    fires = []
    for pinned in (20.0, -20.0):
        vals = {**values, **others, router: torch.full((n,), pinned)}
        fires.append(float((fired_rule(ir, vals, n) == rule).float().mean()))
    if fires[0] == fires[1]:
        raise PolicyViewError(
            f"rule {rule} of {entry!r} fires as often with {router!r} high as low on this data"
        )
    return 1 if fires[0] > fires[1] else -1


def _mlp(sizes: list[int]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def file_split(data: TeacherData, val_frac: float, seed: int) -> torch.Tensor:
    """A bool mask [N] of validation rows: whole files (or, with one file, whole windows) held out."""
    import random

    files = sorted(set(data.window_file))
    if len(files) >= 2:
        rng = random.Random(seed)
        val_files = set(rng.sample(files, max(1, round(len(files) * val_frac))))
        val_windows = torch.tensor([f in val_files for f in data.window_file])
    else:
        w = len(data.window_file)
        if w < 2:
            raise PolicyViewError("train-router needs at least two windows of text to hold one out")
        val_windows = torch.zeros(w, dtype=torch.bool)
        val_windows[: max(1, round(w * val_frac))] = True
    return val_windows[data.window]


def make_label(
    data: TeacherData, entry: str, large: str, label: str, train: torch.Tensor, top_share: float = 0.25
) -> torch.Tensor:
    """Per row, the training target of ``label`` (see the module docstring); ``train``: the rows whose
    means normalise the ``gain`` label and whose gains set the ``top-share`` cut."""
    if label == "top-share":
        return _top_share_label(data, entry, large, train, top_share)
    if label == "divergence":
        return (data.greedy[entry] != data.greedy[large]).float()
    nll_gain = data.nll[entry] - data.nll[large]
    if label == "nll-gain":
        return nll_gain
    acc_gain = data.correct(large).float() - data.correct(entry).float()
    d_acc, d_nll = float(acc_gain[train].mean()), float(nll_gain[train].mean())
    if d_acc <= 0 or d_nll <= 0:
        raise PolicyViewError(
            f"the large model is not better than the small one on this data (accuracy {d_acc:+.4f}, "
            f"NLL {d_nll:+.4f} per position): the gain label needs a gap to recover"
        )
    if label == "expected-gain":
        return data.expected[f"acc/{large}"] / d_acc + data.expected[f"nll/{large}"] / d_nll
    return acc_gain / d_acc + nll_gain / d_nll


def _top_share_label(
    data: TeacherData, entry: str, large: str, train: torch.Tensor, top_share: float
) -> torch.Tensor:
    """1 on the rows whose gain is among the `top_share` largest of the training rows' gains, else 0."""
    gain = make_label(data, entry, large, "gain", train)
    g = gain[train]
    k = max(1, round(top_share * len(g)))
    cut = float(torch.kthvalue(g, len(g) - k + 1).values)  # the k-th largest training gain
    return (gain >= cut).float()


def pairwise_loss(s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """|y_i - y_j|-weighted logistic loss on the order of s, over the pairs (row i, row i + half) of the
    batch (module docstring). The pairs come from the batch's (shuffled) order."""
    h = len(s) // 2
    if h == 0:
        return s.sum() * 0.0
    ds, dy = s[:h] - s[h : 2 * h], y[:h] - y[h : 2 * h]
    return (dy.abs() * torch.nn.functional.softplus(-torch.sign(dy) * ds)).mean()


def _loss_fn(cfg: RouterTrainConfig, yt: torch.Tensor):
    if cfg.loss == "pairwise":
        return pairwise_loss
    if cfg.label in BINARY_LABELS:
        pos = float(yt.sum())
        return torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(yt) - pos) / max(pos, 1.0)))
    return torch.nn.MSELoss()


def _val_pairs(cfg: RouterTrainConfig, xv: torch.Tensor, yv: torch.Tensor):
    """The held-out rows in the order the loss reads them: for the pairwise loss, shuffled once (seeded),
    so that the epochs' held-out losses compare."""
    if cfg.loss != "pairwise":
        return xv, yv
    order = torch.randperm(len(xv), generator=torch.Generator().manual_seed(cfg.seed + 1))
    return xv[order], yv[order]


def merge_ensemble(members: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One router, in the same file layout, whose output is the mean of the members' outputs. The members
    share their inputs and input normalisation (trained on the same rows): the hidden layers are put side
    by side (the first layer's rows stacked, later hidden layers block-diagonal, so no member reads
    another's units) and the output layer averages them."""
    first, k = members[0], len(members)
    for m in members[1:]:
        if not (
            torch.equal(m["input_mean"], first["input_mean"])
            and torch.equal(m["input_std"], first["input_std"])
        ):
            raise ValueError("ensemble members must share their input normalisation")
    out = {"input_mean": first["input_mean"], "input_std": first["input_std"]}
    prefix = "layers." if "layers.0.weight" in first else ""
    n = sum(1 for key in first if key.endswith("weight")) if prefix else 1
    for i in range(n):
        p = f"{prefix}{i}." if prefix else ""
        w, b = _merged_layer([m[p + "weight"] for m in members], [m[p + "bias"] for m in members], i, n, k)
        out[p + "weight"], out[p + "bias"] = w.contiguous(), b.contiguous()
    return out


def _merged_layer(ws: list[torch.Tensor], bs: list[torch.Tensor], i: int, n: int, k: int):
    """Layer `i` of `n` of the merged router from its `k` members' weights and biases."""
    if n == 1:  # one layer: average it
        return torch.stack(ws).mean(0), torch.stack(bs).mean(0)
    if i == 0:
        return torch.cat(ws, 0), torch.cat(bs)
    if i == n - 1:
        return torch.cat(ws, 1) / k, torch.stack(bs).mean(0)
    return torch.block_diag(*ws), torch.cat(bs)


def held_out_loss(tensors: dict[str, torch.Tensor], x, y, val, kind: str, cfg: RouterTrainConfig) -> float:
    """``fit``'s held-out loss of a router given by its tensors (e.g. a merged ensemble)."""
    names = [k for k in tensors if k.endswith("weight")]
    names.sort(key=lambda k: int(k.split(".")[1]) if k.startswith("layers.") else 0)
    sizes = [tensors[names[0]].shape[1], *(tensors[k].shape[0] for k in names)]
    net = _mlp(sizes)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for lin, key in zip(linears, names, strict=True):
            lin.weight.copy_(tensors[key])
            lin.bias.copy_(tensors[key[: -len("weight")] + "bias"])
        xv, yv = _val_pairs(cfg, (x[val] - tensors["input_mean"]) / tensors["input_std"], y[val])
        return float(_loss_fn(cfg, y[~val])(net(xv)[:, 0], yv))


def fit(x: torch.Tensor, y: torch.Tensor, val: torch.Tensor, kind: str, cfg: RouterTrainConfig):
    """Train on rows ~val, early-stop on rows val. Returns (tensors in the docs/ir.md layout, val loss)."""
    torch.manual_seed(cfg.seed)
    xt, yt, xv, yv = x[~val], y[~val], x[val], y[val]
    mean = xt.mean(0)
    std = xt.std(0).clamp_min(1e-4)
    sizes = [x.shape[1], 1] if kind == "linear" else [x.shape[1], *cfg.hidden_layers, 1]
    net = _mlp(sizes)
    loss_fn = _loss_fn(cfg, yt)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    xtn, xvn = (xt - mean) / std, (xv - mean) / std
    xvn, yv = _val_pairs(cfg, xvn, yv)
    best = (float("inf"), None)
    for _ in range(cfg.epochs):
        _train_epoch(net, opt, loss_fn, xtn, yt, torch.randperm(len(xtn), generator=gen).split(cfg.batch))
        net.eval()
        with torch.no_grad():
            vl = float(loss_fn(net(xvn)[:, 0], yv))
        if vl < best[0]:
            best = (vl, {k: v.detach().clone() for k, v in net.state_dict().items()})
    net.load_state_dict(best[1])
    return _tensors(net, kind, mean, std), best[0]


def _train_epoch(net, opt, loss_fn, x: torch.Tensor, y: torch.Tensor, batches) -> None:
    """One pass of the optimizer over the training rows, batch by batch."""
    net.train()
    for idx in batches:
        loss = loss_fn(net(x[idx])[:, 0], y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()


def _tensors(
    net: torch.nn.Sequential, kind: str, mean: torch.Tensor, std: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The trained network's tensors in the docs/ir.md layout, with its input normalization."""
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    tensors: dict[str, torch.Tensor] = {"input_mean": mean.contiguous(), "input_std": std.contiguous()}
    for i, lin in enumerate(linears):
        prefix = "" if kind == "linear" else f"layers.{i}."
        tensors[prefix + "weight"] = lin.weight.detach().float().contiguous()
        tensors[prefix + "bias"] = lin.bias.detach().float().contiguous()
    return tensors


def train_router(
    plan: dict,
    router: str,
    data_dir: Path,
    out: Path | None,
    teacher: TeacherConfig,
    cfg: RouterTrainConfig,
    param: str = "threshold",
    shares: tuple[float, ...] = (0.10, 0.20, 0.25),
    cache: Path | None = None,
) -> RouterReport:
    """Train ``router`` of ``plan`` and write its file. ``param``/``shares``: the report also gives, on the
    held-out split, the value of ``param`` that routes each share (skipped when the policy has no such
    param). ``cache``: a folder that keeps the teacher-forced rows between runs (feature_cache.py)."""
    from tokenrouter.runtime.route.routers import RouterSpec, write_router

    entry, rule, large = router_rule(plan, router)
    spec = RouterSpec.from_plan(router, plan["routers"][router])
    out = _check_settings(plan, router, (entry, large), out, spec.path, teacher, cfg, cache)
    windows = make_windows(data_dir, Path(plan["models"][entry]["path"]), teacher)
    data, cached = teacher_force_cached(cache, plan, entry, [entry, large], windows, teacher, {router: spec},
                                        expected=cfg.label == "expected-gain")  # fmt: skip
    sign = polarity(plan, entry, router, rule, data)
    val = file_split(data, cfg.val_frac, cfg.seed)
    if val.all() or not val.any():
        raise PolicyViewError("the held-out split is empty or takes every row; give more files")
    label = make_label(data, entry, large, cfg.label, ~val, cfg.top_share)
    target = (label if sign > 0 else 1 - label) if cfg.label in BINARY_LABELS else label * sign
    tensors, val_loss = _fit_members(data.router_inputs[router], target, val, spec.kind, cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_router(out, spec, tensors)
    held = _held_out(plan, router, (entry, rule, large), out, data.subset(val), cfg.seed, param, shares)
    return RouterReport(path=str(out), label=cfg.label, rows_train=int((~val).sum()), polarity=sign,
                        val_loss=val_loss, loss=cfg.loss, cache=cached, **held)  # fmt: skip


def _check_settings(plan: dict, router: str, models: tuple[str, str], out: Path | None, router_path: str,
                    teacher: TeacherConfig, cfg: RouterTrainConfig, cache: Path | None) -> Path:  # fmt: skip
    """The file to write (`out`, else the router's path), after the checks of what would fail only after the
    teacher forcing and the training: the file, the cache folder, the router's size, the models' context."""
    from .policy_view import context_error

    given_out = out is not None
    out = Path(out) if given_out else Path(router_path)
    if problem := output_problem(out, "-o" if given_out else "the router file"):
        raise ValueError(problem)
    problem = (
        (folder_problem(cache, "--cache") if cache is not None else None)
        or router_size_problem(plan, router, cfg.hidden_layers, members=cfg.ensemble)
        or context_error(plan, teacher.seq_len, f"--seq-len {teacher.seq_len}", list(models))
    )
    if problem:
        raise TrainSettingsError(problem)
    return out


def _fit_members(
    x: torch.Tensor, target: torch.Tensor, val: torch.Tensor, kind: str, cfg: RouterTrainConfig
) -> tuple[dict[str, torch.Tensor], float]:
    """The router's tensors and held-out loss: one fit, or an ensemble's average."""
    if cfg.ensemble == 1:
        return fit(x, target, val, kind, cfg)
    # members differ in their initial weights and batches (seed + 1000 i), not in the split
    members = [
        fit(x, target, val, kind, replace(cfg, seed=cfg.seed + 1000 * i))[0] for i in range(cfg.ensemble)
    ]
    tensors = merge_ensemble(members)
    return tensors, held_out_loss(tensors, x, target, val, kind, cfg)


def _held_out(plan: dict, router: str, roles: tuple[str, int, str], out: Path, held: TeacherData, seed: int,
              param: str, shares: tuple[float, ...]) -> dict:  # fmt: skip
    """RouterReport's held-out figures, with the new file: the rule at the plan's own threshold, and the sweep."""
    from .evaluate import Scorer

    entry, rule, large = roles
    ir, n = plan["routes"][entry], held.n
    values = _held_out_values(plan, router, ir, out, held, seed)
    fired = fired_rule(ir, values, n)
    routed = fired == rule
    scorer = Scorer(held, entry, routed_shape(plan).targets)
    own = scorer.point(fired)
    div = held.greedy[entry] != held.greedy[large]
    tp = float((routed & div).sum())
    return {
        "rows_val": n,
        "positive_rate": float(div.float().mean()),
        "precision": tp / max(float(routed.sum()), 1.0),
        "recall": tp / max(float(div.sum()), 1.0),
        "routed_share": float(routed.float().mean()),
        "threshold_text": ir["rules"][rule].get("source", ""),
        "acc_gap_recovered": own["acc_gap_recovered"],
        "nll_gap_recovered": own["nll_gap_recovered"],
        "sweep": _sweep(plan, entry, values, n, param, shares, scorer),
    }


def _held_out_values(plan: dict, router: str, ir: dict, out: Path, held: TeacherData, seed: int) -> dict:
    """The route IR's inputs on the held-out rows: their features, uniform() drawn from `seed`, the new router
    file's output (the IR's other routers at 0)."""
    from tokenrouter.runtime.route.routers import RouterSpec, load_router

    n = held.n
    spec = RouterSpec.from_plan(router, plan["routers"][router])
    loaded, _ = load_router(RouterSpec(spec.name, spec.kind, str(out), spec.inputs), None, "cpu")
    values = dict(held.features)
    values["uniform"] = torch.rand(n, generator=torch.Generator().manual_seed(seed))
    values.update({r: torch.zeros(n) for r in ir["routers"]})
    with torch.no_grad():
        values[router] = loaded(held.router_inputs[router])
    return values


def _sweep(
    plan: dict, entry: str, values: dict, n: int, param: str, shares: tuple[float, ...], scorer
) -> list:
    """The held-out value of `param` at each share (none when the policy has no such param)."""
    from .evaluate import sweep_policy
    from .policy_view import threshold_node

    try:
        node = threshold_node(plan, plan["routes"][entry], param)
    except PolicyViewError:
        return []
    return [p for p, _ in sweep_policy(plan, entry, values, n, node, shares, scorer)]


def format_report(rep: RouterReport) -> str:
    """The lines `train-router` prints after the 'wrote ...' line."""
    sign = "high" if rep.polarity > 0 else "low"
    if rep.loss == "pairwise":
        loss = "pairwise ranking loss"
    else:
        loss = "BCE" if rep.label in BINARY_LABELS else "mean squared error"
    lines = [
        f"label {rep.label}; a {sign} output routes; held-out {loss} {rep.val_loss:.4f}",
        f"at the plan's threshold ({rep.threshold_text}), on held-out: routed {rep.routed_share:.3f} of positions; "
        f"greedy tokens differ at {rep.positive_rate:.3f} of positions, precision {rep.precision:.3f}, "
        f"recall {rep.recall:.3f}",
    ]
    if rep.acc_gap_recovered is not None and rep.nll_gap_recovered is not None:
        lines.append(
            f"  gap recovered: accuracy {100 * rep.acc_gap_recovered:.1f} %, NLL {100 * rep.nll_gap_recovered:.1f} %"
        )
    lines.extend(_sweep_line(p) for p in rep.sweep)
    return "\n".join(lines)


def _sweep_line(p: dict) -> str:
    acc, nll = p["acc_gap_recovered"], p["nll_gap_recovered"]
    gaps = (
        f"accuracy {100 * acc:.1f} %, NLL {100 * nll:.1f} %" if acc is not None and nll is not None else "-"
    )
    return f"held-out share {p['share']:.3f} at threshold {p['threshold']:.6g}: gap recovered {gaps}"
