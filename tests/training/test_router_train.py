"""train-router's share-targeted label, pairwise loss and teacher-forcing cache."""

import pytest
import torch

from .test_router_eval import R2R, SMALL, _teacher_rows, cli, write


def test_top_share_label_marks_the_best_training_rows():
    from tokenrouter.training.router_train import make_label

    # per-row accuracy gain 0, +1, 0, 0, 0, -1; NLL gain 0.1, 1.5, -0.5, -0.7, 2.0, 0.1; all rows train
    # except the last
    data = _teacher_rows([1, 2, 3, 4, 5, 6], [1, 5, 3, 4, 5, 7], [1, 5, 9, 4, 5, 6],
                         [0.5, 2.0, 1.0, 0.2, 3.0, 1.0], [0.4, 0.5, 1.5, 0.9, 1.0, 0.9])  # fmt: skip
    train = torch.tensor([True, True, True, True, True, False])
    gain = make_label(data, "slm", "llm", "gain", train)
    top = make_label(data, "slm", "llm", "top-share", train, top_share=0.4)
    # 2 of the 5 training rows: the two largest training gains (rows 1 and 4); the held-out row 5 is
    # labelled by the same cut
    order = torch.argsort(gain[:5], descending=True).tolist()
    assert sorted(order[:2]) == [1, 4]
    assert top[:5].tolist() == [0, 1, 0, 0, 1]
    assert top[5] == float(gain[5] >= gain[:5].sort(descending=True).values[1])
    assert make_label(data, "slm", "llm", "top-share", train, top_share=0.2)[:5].sum() == 1


def test_pairwise_loss_is_zero_for_the_right_order_and_ignores_ties():
    from tokenrouter.training.router_train import pairwise_loss

    y = torch.tensor([3.0, 1.0, 5.0, 0.0, 2.0, 5.0])  # pairs (3, 0), (1, 2), (5, 5): a tie, weight 0
    right = torch.tensor([100.0, -100.0, 100.0, 0.0, 0.0, 0.0])  # s_i - s_j has the sign of y_i - y_j
    assert float(pairwise_loss(right, y)) < 1e-6
    wrong = -right
    # |dy| * softplus(100) per mis-ordered pair: (3 * 100 + 1 * 100 + 0) / 3
    assert float(pairwise_loss(wrong, y)) == pytest.approx(400 / 3, rel=1e-3)
    assert float(pairwise_loss(torch.tensor([7.0]), torch.tensor([1.0]))) == 0.0


def test_pairwise_fit_ranks_by_the_conditional_mean_despite_outliers():
    """Heavy-tailed label noise: the ranking fit must still find the direction of the mean. The noise is drawn
    from 40 fixed seeds (it once came from the unseeded global generator, and the test failed in about 15 %
    of runs): the |Δy|-weighted pairwise loss lets a few extreme pairs pull the fit, so a few draws end well
    off (on 100 draws, 15 below 0.97, the lowest 0.62); most land on it."""
    from tokenrouter.training.router_train import RouterTrainConfig, fit

    g = torch.Generator().manual_seed(0)
    n = 4000
    x = torch.randn(n, 4, generator=g)
    val = torch.arange(n) >= 3200
    cfg = RouterTrainConfig(label="gain", loss="pairwise", epochs=8, batch=128, lr=0.02)
    want = torch.tensor([2.0, -1.0, 0.0, 0.0]) / 5**0.5
    got = []
    with torch.random.fork_rng():
        for seed in range(40):
            torch.manual_seed(seed)
            noise = torch.distributions.StudentT(1.5).sample((n,))  # infinite variance
            y = 2.0 * x[:, 0] - x[:, 1] + noise
            tensors, _ = fit(x, y, val, "linear", cfg)
            w = tensors["weight"][0] / tensors["input_std"]
            got.append(float((w / w.norm()) @ want))
    got.sort()
    assert got[20] > 0.98  # the median draw
    assert sum(v > 0.97 for v in got) >= 34, got  # 37 of 40 on this code


def test_bad_loss_and_share_settings_are_refused():
    from tokenrouter.training.router_train import RouterTrainConfig

    with pytest.raises(ValueError, match="unknown loss 'listwise'"):
        RouterTrainConfig(loss="listwise")
    with pytest.raises(ValueError, match="top_share"):
        RouterTrainConfig(label="top-share", top_share=1.0)


def test_top_share_and_pairwise_from_the_command_line_with_the_cache(
    tmp_path, tiny_pair, tiny_corpus, monkeypatch
):
    from tokenrouter.training import router_train

    policy = write(tmp_path, R2R, "r2r_top", tiny_pair)
    cache = tmp_path / "cache"
    args = ["train-router", policy, "div", "--data", tiny_corpus / "router", *SMALL, "--epochs", "2",
            "--cache", cache]  # fmt: skip
    # the tiny pair has no accuracy gap on this text, so the gain label (and the top-share cut on it) is
    # refused with a message ...
    refused = cli(*args, "--label", "top-share")
    assert refused.returncode == 1 and "needs a gap to recover" in refused.stderr
    assert len(list(cache.glob("*.pt"))) == 1  # the rows were kept before the label was made
    # ... and for the rest of this test the gain is the NLL gain alone
    real = router_train.make_label

    def nll_gain_for_gain(data, entry, large, label, train, top_share=0.25):
        label = "nll-gain" if label == "gain" else label
        return real(data, entry, large, label, train, top_share)

    monkeypatch.setattr(router_train, "make_label", nll_gain_for_gain)
    first = cli(*args, "--label", "top-share", "--top-share", "0.2")
    assert first.returncode == 0, first.stderr
    assert "cache hit" in first.stdout and "label top-share" in first.stdout and "BCE" in first.stdout
    assert len(list(cache.glob("*.pt"))) == 1 and not list(cache.glob("*.tmp"))
    again = cli(*args, "--label", "top-share", "--top-share", "0.2")
    assert "cache hit" in again.stdout
    # the rows read back train the same router: every line after the cache line is the same
    assert again.stdout.splitlines()[1:] == first.stdout.splitlines()[1:]
    ranked = cli(*args, "--label", "nll-gain", "--loss", "pairwise")
    assert ranked.returncode == 0, ranked.stderr
    assert "cache hit" in ranked.stdout and "pairwise ranking loss" in ranked.stdout
    shares = [float(ln.split()[2]) for ln in ranked.stdout.splitlines() if ln.startswith("held-out share")]
    assert len(shares) == 3 and all(
        abs(s - t) <= 0.02 for s, t in zip(shares, (0.10, 0.20, 0.25), strict=True)
    )
    # rows with the expected-gain columns are an entry of their own (the tiny pair's missing accuracy gap
    # then refuses the label, after the rows were kept)
    expected = cli(*args, "--label", "expected-gain")
    assert expected.returncode == 1 and "needs a gap" in expected.stderr
    assert len(list(cache.glob("*.pt"))) == 2
    # other teacher-forcing settings are other rows: another entry, not a wrong hit
    other = cli(*[a if a != "700" else "600" for a in args])
    assert other.returncode == 0 and "cache wrote" in other.stdout
    assert len(list(cache.glob("*.pt"))) == 3
    for entry in cache.glob("*.pt"):
        entry.write_bytes(entry.read_bytes()[:100])  # a cut-off file
    broken = cli(*args)
    assert broken.returncode == 1 and "unreadable" in broken.stderr and "Traceback" not in broken.stderr
    bad = cli(*args, "--loss", "nope")
    assert bad.returncode == 2 and "unknown loss 'nope'" in bad.stderr


def test_expected_gain_label_follows_its_definition():
    from tokenrouter.training.router_train import make_label

    data = _teacher_rows([1, 2, 3, 4], [1, 5, 3, 4], [1, 5, 9, 4], [0.5, 2.0, 1.0, 0.2], [0.4, 0.5, 1.5, 0.9])
    data.expected = {
        "acc/llm": torch.tensor([0.0, 0.3, 0.1, 0.0]),
        "nll/llm": torch.tensor([0.2, 0.9, 0.4, 0.1]),
    }
    train = torch.tensor([True, True, True, True])
    # realized: accuracy gain 0, 1, 0, 0 (d_acc 0.25), NLL gain 0.1, 1.5, -0.5, -0.7 (d_nll 0.1)
    want = torch.tensor([0.0, 0.3, 0.1, 0.0]) / 0.25 + torch.tensor([0.2, 0.9, 0.4, 0.1]) / 0.1
    assert torch.allclose(make_label(data, "slm", "llm", "expected-gain", train), want, atol=1e-4)


def test_teacher_forcing_expected_columns_match_the_models(tmp_path, tiny_pair, tiny_corpus):
    from tokenrouter.training.policy_view import load_plan
    from tokenrouter.training.teacher import TeacherConfig, load_engines, make_windows, teacher_force

    # the router is what teacher forcing gathers data for: it need not exist yet
    plan = load_plan(str(write(tmp_path, R2R, "r2r_x", tiny_pair)), weights_check=False)
    cfg = TeacherConfig(seq_len=64, prompt=8, max_tokens=300)
    windows = make_windows(tiny_corpus / "router", tiny_pair / "py-small", cfg)
    data = teacher_force(plan, "slm", ["llm", "slm"], windows, cfg, expected=True)  # entry not first
    acc, kl = data.expected["acc/llm"], data.expected["nll/llm"]
    same = data.greedy["slm"] == data.greedy["llm"]
    assert same.any() and (~same).any()
    assert torch.all(acc[same] == 0) and torch.all(acc[~same] >= 0) and torch.all(kl >= -1e-5)
    # the first window, directly from the engines
    eng = load_engines(plan, ["slm", "llm"])
    x = torch.tensor(windows[0].ids[:-1])
    lp_s = torch.log_softmax(eng["slm"].forward_full(x)[0].float(), -1)[cfg.prompt :]
    lp_l = torch.log_softmax(eng["llm"].forward_full(x)[0].float(), -1)[cfg.prompt :]
    n = len(lp_s)
    want_kl = (lp_l.exp() * (lp_l - lp_s)).sum(-1)
    p_l = lp_l.exp()
    want_acc = p_l.max(-1).values - p_l.gather(1, lp_s.argmax(-1)[:, None])[:, 0]
    assert torch.allclose(kl[:n], want_kl, atol=1e-5) and torch.allclose(acc[:n], want_acc, atol=1e-6)
    assert not teacher_force(plan, "slm", ["slm", "llm"], windows[:1], cfg).expected  # off by default


def _forward(tensors, x):
    """The docs/ir.md router layout, applied by hand: normalise, then Linear (+ ReLU between layers)."""
    h = (x - tensors["input_mean"]) / tensors["input_std"]
    keys = sorted(
        (k for k in tensors if k.endswith("weight")), key=lambda k: k.split(".")[1] if "." in k else ""
    )
    for i, k in enumerate(keys):
        h = h @ tensors[k].T + tensors[k[: -len("weight")] + "bias"]
        if i < len(keys) - 1:
            h = torch.relu(h)
    return h[:, 0]


@pytest.mark.parametrize("hidden", [(), (5,), (6, 4)])
def test_merged_ensemble_outputs_the_members_mean(hidden):
    from tokenrouter.training.router_train import _mlp, merge_ensemble

    g = torch.Generator().manual_seed(0)
    d, mean, std = 7, torch.randn(7, generator=g), torch.rand(7, generator=g) + 0.5
    members = []
    for _ in range(3):
        net = _mlp([d, *hidden, 1])
        lin = [m for m in net if isinstance(m, torch.nn.Linear)]
        t = {"input_mean": mean, "input_std": std}
        for i, m in enumerate(lin):
            p = f"layers.{i}." if hidden else ""
            t[p + "weight"], t[p + "bias"] = (
                torch.randn(m.weight.shape, generator=g),
                torch.randn(m.bias.shape, generator=g),
            )
        members.append(t)
    merged = merge_ensemble(members)
    x = torch.randn(50, d, generator=g)
    want = torch.stack([_forward(m, x) for m in members]).mean(0)
    assert torch.allclose(_forward(merged, x), want, atol=1e-5)
    if hidden:
        assert merged["layers.0.weight"].shape == (3 * hidden[0], d)
    bad = [members[0], {**members[1], "input_std": std * 2}]
    with pytest.raises(ValueError, match="normalisation"):
        merge_ensemble(bad)


@pytest.mark.parametrize("loss", ["auto", "pairwise"])
def test_held_out_loss_of_a_fit_is_its_reported_loss(loss):
    from tokenrouter.training.router_train import RouterTrainConfig, fit, held_out_loss

    g = torch.Generator().manual_seed(1)
    x = torch.randn(600, 5, generator=g)
    y = x[:, 0] + torch.randn(600, generator=g)
    val = torch.arange(600) >= 450
    cfg = RouterTrainConfig(label="gain", loss=loss, hidden_layers=(8,), epochs=3, batch=64, lr=0.01)
    tensors, val_loss = fit(x, y, val, "mlp", cfg)
    assert held_out_loss(tensors, x, y, val, "mlp", cfg) == pytest.approx(val_loss, rel=1e-5)


def test_ensemble_from_the_command_line(tmp_path, tiny_pair, tiny_corpus):
    from safetensors.torch import load_file

    policy = write(tmp_path, R2R, "r2r_ens", tiny_pair)
    args = ["train-router", policy, "div", "--data", tiny_corpus / "router", *SMALL, "--epochs", "2",
            "--hidden-layers", "8", "--cache", tmp_path / "cache"]  # fmt: skip
    one = cli(*args)
    assert one.returncode == 0, one.stderr
    single = load_file(str(policy.with_suffix(".safetensors")))
    three = cli(*args, "--ensemble", "3")
    assert three.returncode == 0, three.stderr
    merged = load_file(str(policy.with_suffix(".safetensors")))
    assert merged["layers.0.weight"].shape == (24, single["layers.0.weight"].shape[1])
    # member 0 is the single router (same seed): its units come first
    assert torch.equal(merged["layers.0.weight"][:8], single["layers.0.weight"])
    assert torch.allclose(merged["layers.1.weight"][:, :8] * 3, single["layers.1.weight"])
    assert "held-out share" in three.stdout
    assert cli(*args, "--ensemble", "0").returncode == 2
