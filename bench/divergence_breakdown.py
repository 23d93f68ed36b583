"""Where the two models of a routed plan disagree, on teacher-forced held-out text (docs/quality.md, "What falls
short"): the share of positions where the large model is right and the small one wrong, the reverse, both
wrong but different, and both agreeing (right or wrong); and the divergence bound of `tokenrouter eval`
(every divergent position first, in random order) at one large-model share, over many random orders
(its mean and standard deviation, where `eval` prints one draw). Same windows as `eval` (same defaults).

    python bench/divergence_breakdown.py examples/r2r_gain.tr --data .data/corpus/eval
    python bench/divergence_breakdown.py examples/r2r_gain.tr --data .data/corpus/eval -D slm_path=/tmp/m/py-small-deep
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", help="a routed policy (.tr) or plan, as for `tokenrouter eval`")
    ap.add_argument("--data", type=Path, required=True, help="held-out text files (e.g. .data/corpus/eval)")
    ap.add_argument("-D", "--define", action="append", default=[], help="NAME=VALUE param override (.tr)")
    ap.add_argument(
        "--max-tokens", type=int, default=20_000, help="teacher-forced positions (eval's default)"
    )
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per window (eval's default)")
    ap.add_argument("--prompt", type=int, default=16, help="context-only tokens per window (eval's default)")
    ap.add_argument("--share", type=float, default=0.25, help="large-model share of the bound")
    ap.add_argument("--draws", type=int, default=400, help="random orders of the divergent positions")
    args = ap.parse_args(argv)
    import torch

    from tokenrouter.training.evaluate import teacher_force_plan
    from tokenrouter.training.policy_view import PolicyViewError, load_plan, routed_shape
    from tokenrouter.training.teacher import TeacherConfig

    try:
        defines = dict(d.split("=", 1) for d in args.define)
    except ValueError:
        print("error: -D takes NAME=VALUE", file=sys.stderr)
        return 2
    try:
        plan = load_plan(args.plan, defines)
        shape = routed_shape(plan)
        entry, large = shape.entry, shape.targets[0]
        teacher = TeacherConfig(seq_len=args.seq_len, prompt=args.prompt, max_tokens=args.max_tokens)
        data, _ = teacher_force_plan(plan, args.data, teacher)
    except (PolicyViewError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    small_ok = (data.greedy[entry] == data.target).float()
    large_ok = (data.greedy[large] == data.target).float()
    differ = data.greedy[entry] != data.greedy[large]
    n = data.n
    rows = {
        "large right, small wrong": differ & (large_ok > 0),
        "small right, large wrong": differ & (small_ok > 0),
        "both wrong (but different)": differ & (small_ok == 0) & (large_ok == 0),
        "agree, right": ~differ & (small_ok > 0),
        "agree, wrong": ~differ & (small_ok == 0),
    }
    print(f"{n} positions; divergence rate d = {100 * differ.float().mean():.2f} %")
    for name, mask in rows.items():
        print(f"  {name}: {100 * mask.float().mean():.2f} %")
    gap = float(large_ok.mean() - small_ok.mean())
    k = round(args.share * n)
    idx = torch.nonzero(differ).flatten()
    if gap <= 0 or k > len(idx):
        print(
            f"bound at {args.share:g}: 100 % of the gap or no gap (d <= share or the large model no better)"
        )
        return 0
    gen = torch.Generator().manual_seed(0)
    gain = large_ok - small_ok
    got = torch.tensor([float(gain[idx[torch.randperm(len(idx), generator=gen)[:k]]].sum()) / n / gap
                        for _ in range(args.draws)])  # fmt: skip
    print(
        f"divergence bound at share {args.share:g}: {100 * got.mean():.1f} % ± {100 * got.std():.1f} % of the "
        f"accuracy gap over {args.draws} random orders (share / d = {100 * args.share / float(differ.float().mean()):.1f} %)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
