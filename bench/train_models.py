"""Train the demo pair (Qwen3 architecture): py-small (~1.3M parameters) and py-large (~11M); with
``--models small-deep,small-wide``, candidate small models of ~1.9M (7 layers of 128, or 5 of 160; docs/quality.md,
"What falls short"); with ``--models small-kd,...``, small models distilled from a trained large one
(``--teacher``, default ``examples/models/py-large``): the loss mixes cross-entropy on the true token with
KL(teacher || student) on the teacher's full next-token distribution, and the curve records how often the
student's greedy token equals the teacher's on the held-out windows (the pair's agreement, 1 - d in
docs/quality.md).

Reads the prepared corpus (``python -m tokenrouter.training.prepare --out .data/corpus``): ``train.npy`` and
``val.npy`` (uint16 token ids) and ``tokenizer/``. Plain PyTorch on `transformers.Qwen3ForCausalLM`, fixed
seed, AdamW, warmup + cosine, bf16 autocast on CUDA. Evaluates the held-out loss every ``--eval-every``
steps and keeps the best checkpoint. Writes, per model, ``OUT/py-<name>/`` (an HF folder, fp16) and
``OUT/py-<name>.curve.json`` (the loss curve).

    python bench/train_models.py --data .data/corpus --out out/models              # both, on the GPU
    python bench/train_models.py --data .data/corpus --out /tmp/m --tiny           # seconds, on a CPU
    python bench/train_models.py --plot out/models                                 # loss curves -> PNG
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenrouter.training.lm import SHAPES, LMShape, save_hf_folder  # noqa: E402


@dataclass(slots=True)
class TrainConfig:
    steps: int
    batch: int  # sequences per step
    seq_len: int
    lr: float
    warmup: int
    weight_decay: float = 0.1
    dropout: float = 0.0  # on each attention/MLP branch output (training only; the saved model has none)
    min_lr_frac: float = 0.1
    eval_every: int = 100
    eval_tokens: int = 400_000  # of val.npy, evaluated in full windows
    max_seconds: float = 240.0  # a guard: stop at the next evaluation past this (and say so in the meta)
    seed: int = 1234
    distill: float = 0.0  # weight of KL(teacher || student); 0 = plain language modelling, no teacher

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "seq_len", "eval_every", "eval_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0 <= self.dropout < 1:
            raise ValueError("dropout must be in [0, 1)")
        if not 0 < self.lr < 1:
            raise ValueError("lr must be in (0, 1)")
        if not 0 <= self.distill <= 1:
            raise ValueError("distill must be in [0, 1]")


RECIPES = {
    "small": TrainConfig(steps=3000, batch=64, seq_len=512, lr=3e-3, warmup=150),
    # 2500 steps without dropout overfit after ~1000 steps (5 epochs): best held-out 2.195 at step 1000
    "large": TrainConfig(steps=1600, batch=64, seq_len=512, lr=1.5e-3, warmup=100, dropout=0.1),
    "tiny-small": TrainConfig(
        steps=12, batch=4, seq_len=64, lr=3e-3, warmup=2, eval_every=6, eval_tokens=2000
    ),
    "tiny-large": TrainConfig(
        steps=12, batch=4, seq_len=64, lr=3e-3, warmup=2, eval_every=6, eval_tokens=2000
    ),
}
# the candidate small models (not shipped) train on small's recipe, with room for their extra compute when
# trained side by side (--parallel)
for _name in ("small-deep", "small-wide"):
    RECIPES[_name] = replace(RECIPES["small"], max_seconds=420.0)
    RECIPES[f"tiny-{_name}"] = RECIPES["tiny-small"]
# small models distilled from py-large (--teacher): the student's shape is the name before "-kd"
RECIPES["small-kd"] = replace(RECIPES["small"], distill=1.0, max_seconds=420.0)
RECIPES["small-kd-half"] = replace(RECIPES["small-kd"], distill=0.5)
RECIPES["small-kd-long"] = replace(RECIPES["small-kd"], steps=6000, warmup=300, max_seconds=480.0)
RECIPES["small-deep-kd"] = replace(RECIPES["small-kd"])
for _name in ("small-kd", "small-kd-half", "small-kd-long", "small-deep-kd"):
    RECIPES[f"tiny-{_name}"] = replace(RECIPES["tiny-small"], distill=RECIPES[_name].distill)
# --models: small, large, small-deep, small-wide, small-kd, ...
MODELS = tuple(n for n in RECIPES if not n.startswith("tiny-"))


def shape_of(name: str) -> LMShape:
    """The shape a recipe trains: a distilled recipe ("small-kd-half") trains its student's shape ("small")."""
    return SHAPES[name.split("-kd")[0]]


def _shown(path: Path) -> str:
    """A path as the meta records it: relative to the repository when inside it (the shipped folders'
    training.json must not carry the training machine's directories), else as given."""
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        return str(path)


def load_teacher(folder: Path, vocab_size: int, device):
    """The trained large model whose distribution a distilled recipe learns; errors name the folder."""
    import torch
    from transformers import Qwen3ForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"teacher {folder}: no config.json (a trained model folder, e.g. examples/models/py-large)"
        )
    vocab = json.loads((folder / "config.json").read_text()).get("vocab_size")
    if vocab != vocab_size:
        raise ValueError(f"teacher {folder}: vocabulary {vocab}, but the corpus tokenizer has {vocab_size}")
    teacher = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def build_model(shape: LMShape, eos_id: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.rms_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
    )
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config)


def add_branch_dropout(model, p: float) -> None:
    """Dropout on every decoder layer's attention and MLP outputs (before the residual add), by hooks, so
    the module tree and the saved weight names stay exactly HF's."""
    import torch.nn.functional as F

    def hook(mod, _inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training), *out[1:])
        return F.dropout(out, p, mod.training)

    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


def train_one(name: str, data: Path, out: Path, device: str, teacher_dir: Path | None = None) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from tokenrouter.training.tokenizer import EOS, load_tokenizer

    shape, cfg = shape_of(name), RECIPES[name]
    tok = load_tokenizer(data / "tokenizer")
    if tok.get_vocab_size() != shape.vocab_size:
        shape = LMShape(**{**asdict(shape), "vocab_size": tok.get_vocab_size()})
    eos_id = tok.token_to_id(EOS)
    torch.manual_seed(cfg.seed)
    dev = torch.device(device)
    train = torch.from_numpy(np.load(data / "train.npy").astype(np.int64)).to(dev)
    val = torch.from_numpy(np.load(data / "val.npy").astype(np.int64)).to(dev)
    if train.numel() <= cfg.seq_len + 1 or val.numel() <= cfg.seq_len + 1:
        raise ValueError(f"corpus in {data} is shorter than one training window")
    n_val = min(cfg.eval_tokens, val.numel() - 1) // cfg.seq_len
    val_x = val[: n_val * cfg.seq_len].view(n_val, cfg.seq_len)
    val_y = val[1 : n_val * cfg.seq_len + 1].view(n_val, cfg.seq_len)

    teacher = None
    if cfg.distill > 0:
        if teacher_dir is None:
            raise ValueError(f"{name} is distilled: give --teacher FOLDER")
        teacher = load_teacher(teacher_dir, shape.vocab_size, dev)
    model = build_model(shape, eos_id).to(dev)
    if cfg.dropout > 0:
        add_branch_dropout(model, cfg.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=dev.type == "cuda",
    )
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    offsets = torch.arange(cfg.seq_len + 1, device=dev)

    def logits_of(net, x):
        with amp:
            return net(input_ids=x).logits.float()

    def loss_of(x, y):
        logits = logits_of(model, x)
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        if teacher is None:
            return ce
        with torch.no_grad():
            t_logp = F.log_softmax(logits_of(teacher, x), dim=-1).view(-1, logits.size(-1))
        s_logp = F.log_softmax(logits, dim=-1).view(-1, logits.size(-1))
        kl = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean")
        return (1 - cfg.distill) * ce + cfg.distill * kl

    teacher_greedy = None
    if teacher is not None:  # the teacher's greedy tokens on the held-out windows, once
        with torch.no_grad():
            teacher_greedy = torch.cat(
                [logits_of(teacher, val_x[i : i + 32]).argmax(-1) for i in range(0, n_val, 32)]
            )

    @torch.no_grad()
    def val_loss() -> tuple[float, float | None]:
        """Held-out cross-entropy on the true tokens and, with a teacher, the greedy agreement with it."""
        model.eval()
        tot, agree = 0.0, 0
        for i in range(0, n_val, 32):
            logits = logits_of(model, val_x[i : i + 32])
            ce = F.cross_entropy(logits.view(-1, logits.size(-1)), val_y[i : i + 32].reshape(-1))
            tot += float(ce) * logits.shape[0]
            if teacher_greedy is not None:
                agree += int((logits.argmax(-1) == teacher_greedy[i : i + 32]).sum())
        model.train()
        return tot / n_val, (agree / val_x.numel() if teacher_greedy is not None else None)

    curve: list[dict] = []
    best = {"val_loss": float("inf"), "step": -1, "state": None}
    t0 = time.perf_counter()
    stopped_early = False
    ema = None
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        starts = torch.randint(0, train.numel() - cfg.seq_len - 1, (cfg.batch, 1), device=dev, generator=gen)
        win = train[starts + offsets]
        loss = loss_of(win[:, :-1], win[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = step == cfg.steps - 1
        if (step + 1) % cfg.eval_every == 0 or last:
            lv = float(loss.detach())
            ema = lv if ema is None else 0.8 * ema + 0.2 * lv
            vl, agree = val_loss()
            elapsed = time.perf_counter() - t0
            curve.append(
                {
                    "step": step + 1,
                    "train_loss": lv,
                    "val_loss": vl,
                    **({"agree_with_teacher": agree} if agree is not None else {}),
                    "lr": lr_at(step, cfg),
                    "seconds": round(elapsed, 2),
                    "tokens": (step + 1) * cfg.batch * cfg.seq_len,
                }
            )
            agreed = f" agree {agree:.4f}" if agree is not None else ""
            print(
                f"[{name}] step {step + 1}/{cfg.steps} train {lv:.4f} val {vl:.4f}{agreed} {elapsed:.1f}s",
                flush=True,
            )
            if vl < best["val_loss"]:
                best = {
                    "val_loss": vl,
                    "step": step + 1,
                    "state": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                }
            if elapsed > cfg.max_seconds and not last:
                stopped_early = True
                print(f"[{name}] stopped at step {step + 1}: over max_seconds={cfg.max_seconds}", flush=True)
                break
    meta = {
        "name": f"py-{name}",
        "params": n_params,
        "shape": asdict(shape),
        "train": asdict(cfg),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "train_tokens_in_corpus": int(train.numel()),
        "best_step": best["step"],
        "best_val_loss": best["val_loss"],
        "final_val_loss": curve[-1]["val_loss"],
        "seconds": round(time.perf_counter() - t0, 1),
        "stopped_early": stopped_early,
        "val_tokens": n_val * cfg.seq_len,
        "teacher": _shown(teacher_dir) if teacher is not None else None,
        "best_agree_with_teacher": next(
            (p.get("agree_with_teacher") for p in curve if p["step"] == best["step"]), None
        ),
    }
    folder = out / f"py-{name.removeprefix('tiny-')}"
    save_hf_folder(best["state"], shape, data / "tokenizer", folder, eos_id, meta)
    (out / f"{folder.name}.curve.json").write_text(
        json.dumps({"meta": meta, "curve": curve}, indent=1) + "\n"
    )
    print(
        json.dumps({k: meta[k] for k in ("name", "params", "best_step", "best_val_loss", "seconds")}),
        flush=True,
    )
    return meta


def plot(folder: Path) -> Path:
    from tokenrouter.plotting import figure

    out = folder / "loss_curves.png"
    with figure(out, (7, 4.5), dpi=110) as (_, ax):
        _draw_curves(ax, folder)
    return out


def _draw_curves(ax, folder: Path) -> None:
    for path in sorted(folder.glob("py-*.curve.json")):
        d = json.loads(path.read_text())
        tokens = [p["tokens"] / 1e6 for p in d["curve"]]
        name = d["meta"]["name"]
        distilled = d["meta"]["train"].get("distill", 0) > 0
        train_label = f"{name} train (distillation loss)" if distilled else f"{name} train"
        ax.plot(tokens, [p["train_loss"] for p in d["curve"]], alpha=0.5, label=train_label)
        ax.plot(tokens, [p["val_loss"] for p in d["curve"]], label=f"{name} held-out")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("Demo pair on Python stdlib source")
    ax.grid(alpha=0.3)
    ax.legend()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Train the demo pair py-small / py-large.")
    ap.add_argument("--data", type=Path, default=Path(".data/corpus"))
    ap.add_argument("--out", type=Path, default=Path("out/models"))
    ap.add_argument("--models", default="small,large", help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--tiny", action="store_true", help="toy shapes and a dozen steps (CPU smoke test)")
    ap.add_argument("--parallel", action="store_true", help="train the models at once, one process each")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument(
        "--teacher",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "examples" / "models" / "py-large",
        help="the trained large model that the -kd recipes distil (default: examples/models/py-large)",
    )
    ap.add_argument("--plot", type=Path, default=None, help="only plot the curves found in this folder")
    args = ap.parse_args(argv)
    if args.plot is not None:
        print(plot(args.plot))
        return 0
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad or not names:
        print(f"error: --models takes {', '.join(MODELS)}, got {args.models!r}", file=sys.stderr)
        return 2
    if not (args.data / "train.npy").is_file():
        print(
            f"error: no train.npy in {args.data}; run python -m tokenrouter.training.prepare first",
            file=sys.stderr,
        )
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    if args.parallel and len(names) > 1:
        base = [sys.executable, __file__, "--data", str(args.data), "--out", str(args.out)]
        base += ["--tiny"] if args.tiny else []
        base += ["--device", args.device] if args.device else []
        base += ["--teacher", str(args.teacher)]
        procs = [subprocess.Popen([*base, "--models", n]) for n in names]
        return max(p.wait() for p in procs)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for n in names:
        try:
            train_one(f"tiny-{n}" if args.tiny else n, args.data, args.out, device, args.teacher)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
