import json

import pytest
import torch

from tokenrouter.training.policy_view import PolicyViewError, fired_rule, load_plan, routed_shape

R2R = """policy tiny_r2r "test"
param threshold: float = 0.5
model slm = "{small}" {{ gpu: 0 }}
model llm = "{large}" {{ gpu: 0 }}
router div = mlp("{router}", hidden(slm), topk_logits(slm, 8), embedding(slm, token))
entry slm
route slm {{
  when sigmoid(div) >= threshold -> llm drop for 1
}}
"""

CITER = """policy tiny_citer "test"
param threshold: float = 0.5
model slm = "{small}" {{ gpu: 0 }}
model llm = "{large}" {{ gpu: 0 }}
router trust = linear("{router}", hidden(slm), topk_logprobs(slm, 4))
entry slm
route slm {{
  when sigmoid(trust) < threshold and confidence < 0.99 -> llm drop
}}
route llm {{
  -> slm
}}
"""

KEEP = """policy tiny_keep "test"
param threshold: float = 0.5
model slm = "{small}" {{ gpu: 0 }}
model llm = "{large}" {{ gpu: 0 }}
entry slm
route slm {{
  when entropy > threshold -> llm
}}
"""


def write(tmp_path, template, name, tiny_pair):
    p = tmp_path / f"{name}.tr"
    p.write_text(template.format(small=tiny_pair / "py-small", large=tiny_pair / "py-large",
                                 router=tmp_path / f"{name}.safetensors"))  # fmt: skip
    return p


class Result:
    def __init__(self, r) -> None:
        self.returncode, self.stdout, self.stderr = r.exit_code, r.stdout, r.stderr
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # no traceback


def cli(*args):
    """The real command line, in-process (a subprocess per call would re-import torch each time)."""
    from typer.testing import CliRunner

    from tokenrouter.cli import app

    return Result(CliRunner().invoke(app, [str(a) for a in args]))


SMALL = ["--max-tokens", "700", "--seq-len", "64", "--prompt", "8"]


@pytest.fixture(scope="module")
def trained_r2r(tmp_path_factory, tiny_pair, tiny_corpus):
    tmp = tmp_path_factory.mktemp("r2r")
    policy = write(tmp, R2R, "r2r", tiny_pair)
    proc = cli("train-router", policy, "div", "--data", tiny_corpus / "router", *SMALL, "--epochs", "3")
    assert proc.returncode == 0, proc.stderr
    return policy, proc.stdout


def test_train_router_writes_the_documented_layout(trained_r2r):
    from safetensors import safe_open

    policy, out = trained_r2r
    assert "precision" in out and "recall" in out
    with safe_open(str(policy.with_suffix(".safetensors")), "pt") as f:
        meta = f.metadata()
        shapes = {k: list(f.get_tensor(k).shape) for k in f.keys()}
    assert meta["format"] == "tokenrouter.router/1" and meta["kind"] == "mlp"
    d = 32 + 8 + 32  # hidden(tiny-small) + top-8 logits + embedding
    assert shapes == {"layers.0.weight": [256, d], "layers.0.bias": [256], "layers.1.weight": [1, 256],
                      "layers.1.bias": [1], "input_mean": [d], "input_std": [d]}  # fmt: skip


def test_eval_json_and_plot(trained_r2r, tiny_corpus, tmp_path):
    policy, _ = trained_r2r
    png = tmp_path / "q.png"
    proc = cli("eval", policy, "--data", tiny_corpus / "eval", "--json", "--plot", png, "--shares", "0.1,0.25,0.5",
               "--generate", "2", "--max-new-tokens", "6", *SMALL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert png.stat().st_size > 10_000
    gen = res["generated"]
    assert set(gen["runs"]) == {"routed", "slm alone", "llm alone"} and gen["prompts"] == 2
    for r in gen["runs"].values():
        assert 0 < r["tokens"] <= 12 and r["large_nll_per_token"] > 0
    assert 0 <= gen["runs"]["routed"]["large_share"] <= 1
    assert set(res["curves"]) == {
        "policy",
        "confidence",
        "entropy",
        "random",
        "query",
        "divergence",
        "oracle",
    }
    n = res["tokens"]
    assert 600 <= n <= 700 + 64
    for method, pts in res["curves"].items():
        assert [p["target_share"] for p in pts] == [0.1, 0.25, 0.5]
        for p in pts:
            assert 0 <= p["accuracy"] <= 1 and p["nll"] > 0
            if method != "query":  # query moves in whole windows
                assert abs(p["share"] - p["target_share"]) <= 0.02, (method, p)
    # the oracle is an upper bound on NLL at every share; shares rise monotonically along the sweep
    for i in range(3):
        assert (
            res["curves"]["oracle"][i]["nll"] <= min(res["curves"][m][i]["nll"] for m in res["curves"]) + 1e-9
        )
    # the divergence bound routes every position where the greedy tokens differ first; at agreeing positions
    # both models are equally right, so from a share of the divergence rate on it has the large one's accuracy
    full = [p for p in res["curves"]["divergence"] if p["share"] >= res["label_rate"]]
    assert full
    for p in full:
        assert p["accuracy"] == pytest.approx(res["large"]["accuracy"], abs=1e-9)
    for base in ("confidence", "entropy"):
        for i, r in enumerate(res["policy_minus"][base]):
            lo, hi = r["accuracy_ci95"]
            assert lo <= r["accuracy"] <= hi
            want = res["curves"]["policy"][i]["accuracy"] - res["curves"][base][i]["accuracy"]
            assert abs(r["accuracy"] - want) < 1e-6
    th = [p["threshold"] for p in res["curves"]["policy"]]
    assert th[0] > th[1] > th[2]  # `>= threshold`: a lower threshold routes more


def test_eval_cache_gives_the_same_result_for_another_router_file(
    trained_r2r, tiny_corpus, tiny_pair, tmp_path
):
    policy, _ = trained_r2r
    cache = tmp_path / "cache"
    args = [
        "eval",
        policy,
        "--data",
        tiny_corpus / "eval",
        "--json",
        "--shares",
        "0.2",
        *SMALL,
        "--cache",
        cache,
    ]
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    assert len(list(cache.glob("*.pt"))) == 1
    again = cli(*args)
    assert json.loads(again.stdout) == json.loads(first.stdout)
    # the rows hold the router's inputs, so another router file reads the same entry, with its own outputs
    from safetensors.torch import load_file, save_file

    other = write(tmp_path, R2R, "other", tiny_pair)  # the same policy, reading other.safetensors
    tensors = load_file(str(policy.with_suffix(".safetensors")))
    save_file(
        {k: -v if k.endswith("weight") else v for k, v in tensors.items()},
        str(other.with_suffix(".safetensors")),
    )
    flipped = cli(*[other if a == policy else a for a in args])
    assert flipped.returncode == 0, flipped.stderr
    assert len(list(cache.glob("*.pt"))) == 1
    res, res0 = json.loads(flipped.stdout), json.loads(first.stdout)
    assert res["curves"]["confidence"] == res0["curves"]["confidence"]
    assert res["curves"]["policy"] != res0["curves"]["policy"]


R2R_PARAMS = """policy tiny_r2r "test"
param threshold: float = 0.5
param large: str = "{large}"
param router_path: str = "{router}"
model slm = "{small}" {{ gpu: 0 }}
model llm = large {{ gpu: 0 }}
router div = mlp(router_path, hidden(slm), topk_logits(slm, 8), embedding(slm, token))
entry slm
route slm {{
  when sigmoid(div) >= threshold -> llm drop for 1
}}
"""


def test_eval_versus_another_router_file(trained_r2r, tiny_corpus, tiny_pair, tmp_path):
    from safetensors.torch import load_file, save_file

    trained, _ = trained_r2r
    policy = write(tmp_path, R2R_PARAMS, "p", tiny_pair)
    save_file(load_file(str(trained.with_suffix(".safetensors"))), str(tmp_path / "p.safetensors"))
    tensors = load_file(str(trained.with_suffix(".safetensors")))
    flipped = tmp_path / "flipped.safetensors"
    save_file({k: -v if k.endswith("weight") else v for k, v in tensors.items()}, str(flipped))
    args = ["eval", policy, "--data", tiny_corpus / "eval", "--json", "--shares", "0.2,0.4", *SMALL]
    same = json.loads(cli(*args, "--versus", f"router_path={tmp_path / 'p.safetensors'}").stdout)
    for r in same["policy_minus"]["versus"]:
        assert r["accuracy"] == 0 and r["nll"] == 0 and r["accuracy_ci95"] == [0, 0]
    res = json.loads(cli(*args, "--versus", f"router_path={flipped}").stdout)
    alone = json.loads(cli(*args, "-D", f"router_path={flipped}").stdout)
    assert res["curves"]["versus"] == alone["curves"]["policy"]
    for r, a, b in zip(
        res["policy_minus"]["versus"], res["curves"]["policy"], alone["curves"]["policy"], strict=True
    ):
        assert r["accuracy"] == pytest.approx(a["accuracy"] - b["accuracy"], abs=1e-6)
        assert r["accuracy_ci95"][0] <= r["accuracy"] <= r["accuracy_ci95"][1]
    assert any(r["accuracy"] != 0 or r["nll"] != 0 for r in res["policy_minus"]["versus"])
    table = cli(*[a for a in args if a != "--json"], "--versus", f"router_path={flipped}").stdout
    assert "policy minus versus" in table and "versus" in table.splitlines()[6]
    bad = cli(*args, "--versus", f"large={tiny_pair / 'py-small'}")
    assert bad.returncode == 1 and "--versus may change params" in bad.stderr


def test_eval_table_and_errors(trained_r2r, tiny_corpus):
    policy, _ = trained_r2r
    proc = cli("eval", policy, "--data", tiny_corpus / "eval", "--shares", "0.2", *SMALL)
    assert proc.returncode == 0, proc.stderr
    assert "gap recovered" in proc.stdout and "small " in proc.stdout
    bad = cli("eval", policy, "--data", tiny_corpus / "eval", "--param", "nope", *SMALL)
    assert bad.returncode == 1 and "no param 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("eval", policy, "--data", tiny_corpus / "nowhere", *SMALL)
    assert bad.returncode == 1 and "does not exist" in bad.stderr
    bad = cli("eval", policy, "--data", tiny_corpus / "eval", "--shares", "1.5")
    assert bad.returncode == 2


def test_citer_polarity_and_rule_matches_the_route_kernel(tmp_path, tiny_pair, tiny_corpus):
    """A policy where a LOW router output routes; the evaluator's decisions equal the real route kernel's."""
    from tokenrouter.runtime.engine.embedded import load_engine
    from tokenrouter.runtime.route.kernel import RouteBatchState, RouteKernel
    from tokenrouter.training.evaluate import policy_values
    from tokenrouter.training.router_train import RouterTrainConfig, train_router
    from tokenrouter.training.teacher import TeacherConfig, make_windows, teacher_force

    policy = write(tmp_path, CITER, "citer", tiny_pair)
    plan = load_plan(policy, weights_check=False)  # the router is trained below
    teacher = TeacherConfig(seq_len=64, prompt=8, max_tokens=500)
    rep = train_router(plan, "trust", tiny_corpus / "router", None, teacher, RouterTrainConfig(epochs=2))
    assert rep.polarity == -1 and 0 <= rep.precision <= 1 and 0 <= rep.recall <= 1
    windows = make_windows(tiny_corpus / "eval", tiny_pair / "py-small", teacher)[:2]
    from tokenrouter.runtime.route.routers import RouterSpec

    spec = RouterSpec.from_plan("trust", plan["routers"]["trust"])
    data = teacher_force(plan, "slm", ["slm", "llm"], windows, teacher, routers={"trust": spec})
    ours = fired_rule(plan["routes"]["slm"], policy_values(plan, "slm", data, 0), data.n)
    engine = load_engine(tiny_pair / "py-small", device="cpu", dtype="float32", max_tokens=64)
    kernel = RouteKernel(plan, "slm", "torch", "cpu", engine.embed)
    got = []
    for w in windows:
        logits, hidden = engine.forward_full(w.ids[:-1])
        t = torch.arange(8, len(w.ids) - 1)
        state = RouteBatchState.make(len(t), position=(t + 1).tolist(), generated=(t - 7).tolist(),
                                     run_length=(t - 7).tolist())  # fmt: skip
        got.append(kernel(logits[8:].contiguous(), hidden[8:], state).rule)
    assert torch.equal(ours, torch.cat(got).to(ours.dtype))
    assert (ours == 0).any() or (ours == -1).all()


def test_unsupported_policy_shape_is_a_clear_error(tmp_path, tiny_pair, tiny_corpus):
    policy = write(tmp_path, KEEP, "keep", tiny_pair)
    with pytest.raises(PolicyViewError, match="supports `drop` hand-offs only"):
        routed_shape(load_plan(policy))
    proc = cli("eval", policy, "--data", tiny_corpus / "eval", *SMALL)
    assert proc.returncode == 1 and "drop" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("train-router", policy, "nope", "--data", tiny_corpus / "router", *SMALL)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


def _teacher_rows(greedy_small, greedy_large, target, nll_small, nll_large):
    from tokenrouter.training.teacher import TeacherData

    t = lambda v: torch.tensor(v)  # noqa: E731
    return TeacherData(models=["slm", "llm"], target=t(target), greedy={"slm": t(greedy_small), "llm": t(greedy_large)},
                       nll={"slm": t(nll_small), "llm": t(nll_large)})  # fmt: skip


def test_labels_follow_their_definitions():
    from tokenrouter.training.router_train import make_label

    data = _teacher_rows([1, 2, 3, 4], [1, 5, 3, 6], [1, 5, 9, 4], [0.5, 2.0, 1.0, 0.2], [0.4, 0.5, 1.5, 0.9])
    train = torch.tensor([True, True, True, True])
    assert make_label(data, "slm", "llm", "divergence", train).tolist() == [0, 1, 0, 1]
    nll_gain = make_label(data, "slm", "llm", "nll-gain", train)
    assert torch.allclose(nll_gain, torch.tensor([0.1, 1.5, -0.5, -0.7]))
    # accuracy gain per row: 0, +1, 0, -1 -> mean 0; the gain label needs the large model ahead on both
    with pytest.raises(PolicyViewError, match="not better"):
        make_label(data, "slm", "llm", "gain", train)
    only3 = torch.tensor([True, True, True, False])  # mean accuracy gain 1/3, mean NLL gain 1.1/3
    gain = make_label(data, "slm", "llm", "gain", only3)
    want = torch.tensor([0.0, 1.0, 0.0, -1.0]) * 3 + torch.tensor([0.1, 1.5, -0.5, -0.7]) * 3 / 1.1
    assert torch.allclose(gain, want, atol=1e-5)


def test_gain_labels_fit_a_regression_not_a_classifier():
    """The gain labels are real-valued: the fit must rank rows by the target's conditional mean."""
    from tokenrouter.training.router_train import RouterTrainConfig, fit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 6, generator=g)
    y = 3.0 * x[:, 0] - x[:, 1] + 0.3 * torch.randn(3000, generator=g)
    val = torch.arange(3000) >= 2400
    tensors, val_loss = fit(
        x, y, val, "linear", RouterTrainConfig(label="nll-gain", epochs=10, batch=64, lr=0.02)
    )
    w, b = tensors["weight"][0], tensors["bias"][0]
    pred = ((x[val] - tensors["input_mean"]) / tensors["input_std"]) @ w + b
    assert val_loss < 0.2  # mean squared error near the noise variance (0.09), far below var(y) ~ 10
    assert float(((pred - y[val]) ** 2).mean()) == pytest.approx(val_loss, rel=1e-4)


def test_train_router_gain_label_from_the_command_line(tmp_path, tiny_pair, tiny_corpus):
    policy = write(tmp_path, R2R, "r2r_gain", tiny_pair)
    proc = cli("train-router", policy, "div", "--data", tiny_corpus / "router", *SMALL, "--epochs", "2",
               "--label", "nll-gain")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "label nll-gain" in proc.stdout and "mean squared error" in proc.stdout
    shares = [
        float(line.split()[2]) for line in proc.stdout.splitlines() if line.startswith("held-out share")
    ]
    assert len(shares) == 3 and all(
        abs(s - t) <= 0.02 for s, t in zip(shares, (0.10, 0.20, 0.25), strict=True)
    )
    assert policy.with_suffix(".safetensors").stat().st_size > 0
    bad = cli("train-router", policy, "div", "--data", tiny_corpus / "router", *SMALL, "--label", "nope")
    assert bad.returncode == 2 and "unknown label 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_divergence_breakdown_adds_up_and_matches_eval(trained_r2r, tiny_corpus):
    """bench/divergence_breakdown.py (docs/quality.md's table of where the models disagree): the five
    kinds of position cover all of them, the three divergent ones add up to eval's label rate on the
    same windows, and the bound's mean over random orders is printed."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    policy, _ = trained_r2r
    script = Path(__file__).resolve().parents[2] / "bench" / "divergence_breakdown.py"
    proc = subprocess.run([sys.executable, str(script), str(policy), "--data", str(tiny_corpus / "eval"), *SMALL,
                           "--draws", "20"], capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    pct = {k: float(v) for k, v in re.findall(r"  (.+): ([0-9.]+) %", proc.stdout)}
    assert len(pct) == 5 and sum(pct.values()) == pytest.approx(100, abs=0.05)
    d = float(re.search(r"divergence rate d = ([0-9.]+) %", proc.stdout).group(1))
    divergent = ("large right, small wrong", "small right, large wrong", "both wrong (but different)")
    assert sum(pct[k] for k in divergent) == pytest.approx(d, abs=0.02)
    res = json.loads(cli("eval", policy, "--data", tiny_corpus / "eval", "--json", *SMALL).stdout)
    assert d == pytest.approx(100 * res["label_rate"], abs=0.006)
    assert "divergence bound at share 0.25" in proc.stdout or "no gap" in proc.stdout
    bad = subprocess.run([sys.executable, str(script), str(policy) + ".nope", "--data", str(tiny_corpus)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 1 and "error:" in bad.stderr and "Traceback" not in bad.stderr


def test_gap_recovered_interval_brackets_the_estimate_and_is_exact_at_the_ends():
    from tokenrouter.training.evaluate import Scorer
    from tokenrouter.training.teacher import TeacherData

    gen = torch.Generator().manual_seed(0)
    n, windows = 4000, 40
    target = torch.randint(0, 5, (n,), generator=gen)
    # the large model is right more often than the small one
    large = torch.where(torch.rand(n, generator=gen) < 0.7, target, (target + 1) % 5)
    small = torch.where(torch.rand(n, generator=gen) < 0.5, target, (target + 2) % 5)
    data = TeacherData(
        models=["slm", "llm"],
        target=target,
        greedy={"slm": small, "llm": large},
        nll={"slm": torch.rand(n, generator=gen) + 1.0, "llm": torch.rand(n, generator=gen) + 0.5},
        window=torch.arange(n) * windows // n,
        window_file=[f"f{i}" for i in range(windows)],
    )
    scorer = Scorer(data, "slm", ["llm"])
    half = torch.where(torch.rand(n, generator=gen) < 0.5, 0, -1)
    point = scorer.point(half)
    ci = scorer.gap_recovered_ci(half, seed=1)
    for key in ("acc", "nll"):
        lo, hi = ci[f"{key}_gap_recovered_ci95"]
        assert lo < point[f"{key}_gap_recovered"] < hi and hi - lo < 0.5
    # all rows to the large model recover exactly the whole gap, none recovers nothing, in every resample
    assert scorer.gap_recovered_ci(torch.zeros(n, dtype=torch.int64), seed=1)["acc_gap_recovered_ci95"] == [
        1.0,
        1.0,
    ]
    assert scorer.gap_recovered_ci(torch.full((n,), -1), seed=1)["nll_gap_recovered_ci95"] == [0.0, 0.0]
