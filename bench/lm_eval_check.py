"""lm-eval against `tokenrouter serve`, end to end: starts the server on a two-model policy (by default the tiny
random-weight example models, on the CPU), runs lm-eval's `local-completions` and `local-chat-completions`
backends on `generate_until` tasks (by default `tr_arithmetic`; also `tr_python`, Python lines to finish, for
the trained demo pair), then `local-completions` on loglikelihood tasks (by default `tr_arithmetic_mc`, the same
sums as multiple choice; also `tr_python_mc`), prints the table lm-eval reports for each and stops the server.
The tasks ship in bench/lm_eval/ and load without network. Needs `pip install 'lm-eval[api]'` (0.4.10 or later:
0.4.9 does not import with transformers 5).

Loglikelihood tasks run on the completions backend only (lm-eval asks for `echo: true` with prompt logprobs,
which chat completions do not have): their figures are the entry model's, which scores every prompt.

    python bench/lm_eval_check.py                        # tiny models, CPU, 20 prompts
    python bench/lm_eval_check.py --small examples/models/py-small --large examples/models/py-large \
        --tasks tr_python --ll-tasks tr_python_mc
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from served import ROOT, Server, stop_live  # noqa: E402

MODELS = ROOT / "examples" / "models"
TASKS_DIR = ROOT / "bench" / "lm_eval"
POLICY = """\
policy lmeval "lm-eval check: the small model writes, the large one takes over with probability {p}"
model slm = "{small}" {{ gpu: 0, batch: 4 }}
model llm = "{large}" {{ gpu: 0, batch: 4 }}
serve {{ concurrency: 8, max_delay_ms: 5 }}
entry slm
route slm {{
  when uniform() < {p} -> llm
}}
route llm {{
  when uniform() < 0.7 -> slm
}}
"""
# (lm-eval model type, endpoint, extra lm_eval arguments)
BACKENDS = (
    ("local-completions", "/v1/completions", []),
    ("local-chat-completions", "/v1/chat/completions", ["--apply_chat_template"]),
)
LOGLIKELIHOOD = ("local-completions", "/v1/completions", [])  # the backend of the loglikelihood tasks


def lm_eval_command(backend: str, url: str, policy: str, tokenizer: Path, args: argparse.Namespace,
                    out: Path, tasks: str | None = None) -> list[str]:  # fmt: skip
    """The `lm_eval` command line for one backend; `url` is the endpoint's full URL; `tasks`: args.tasks unless
    given."""
    backend_args = {"model": policy, "base_url": url, "num_concurrent": args.concurrent, "max_retries": 1}
    if backend == "local-completions":
        backend_args |= {"tokenizer": str(tokenizer), "tokenizer_backend": "huggingface",
                         "tokenized_requests": True}  # fmt: skip
    else:
        backend_args |= {"tokenizer_backend": "none"}
    cmd = [sys.executable, "-m", "lm_eval", "--model", backend,
           "--model_args", ",".join(f"{k}={v}" for k, v in backend_args.items()),
           "--include_path", str(TASKS_DIR), "--tasks", tasks or args.tasks, "--output_path", str(out),
           "--seed", "0", "--log_samples"]  # fmt: skip
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    return cmd


def _newest(out: Path, pattern: str) -> Path:
    files = sorted(out.rglob(pattern), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError(f"lm-eval wrote no {pattern} under {out}")
    return files[-1]


def results(out: Path) -> dict:
    """The `results` section of the newest results JSON lm-eval wrote under `out`."""
    return json.loads(_newest(out, "results_*.json").read_text())["results"]


def answers(out: Path, task: str) -> list[str]:
    """The answers lm-eval scored for `task` (after the task's filter), one per document, from its samples."""
    lines = _newest(out, f"samples_{task}_*.jsonl").read_text().splitlines()
    return [json.loads(line)["filtered_resps"][0] for line in lines if line.strip()]


def choice_scores(out: Path, task: str) -> str:
    """A loglikelihood task's first document as lm-eval scored it: each continuation with its log-likelihood
    (the sum of its tokens' prompt logprobs), and the right one."""
    line = _newest(out, f"samples_{task}_*.jsonl").read_text().splitlines()[0]
    sample = json.loads(line)
    conts = [a["arg_1"] for a in sample["arguments"].values()]
    scores = [float(r[0]) for r in sample["filtered_resps"]]
    shown = ", ".join(f"{c!r}: {v:.2f}" for c, v in zip(conts, scores, strict=True))
    return f"{shown}; right: {conts[int(sample['target'])]!r}"


def run_backend(srv: Server, backend: str, endpoint: str, extra: list[str], tasks: str, args: argparse.Namespace,
                out: Path, env: dict) -> bool:  # fmt: skip
    """Run lm_eval with one backend on `tasks` against the server, print its table and each task's scores;
    False when lm_eval failed (its output's tail printed)."""
    run_out = out / f"{backend}-{tasks.replace(',', '-')}"
    cmd = lm_eval_command(backend, srv.url + endpoint, "lmeval", args.small.resolve(), args, run_out, tasks)
    cmd += extra
    print(f"\n$ lm_eval --model {backend} --tasks {tasks} ... {' '.join(extra)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    (run_out.parent / f"{run_out.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        print(f"{backend}: lm_eval exited {proc.returncode}:\n{tail}", file=sys.stderr)
        return False
    print("\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith("|")))
    for task, metrics in results(run_out).items():
        scores = {k: v for k, v in metrics.items() if isinstance(v, float) and "stderr" not in k}
        got = answers(run_out, task)
        first = repr(got[0]) if not got or isinstance(got[0], str) else choice_scores(run_out, task)
        print(f"{backend} {task}: {json.dumps(scores)}, {len(got)} answers (first: {first}), {wall:.1f} s")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--small", type=Path, default=MODELS / "tiny-small", help="the small model's folder")
    ap.add_argument("--large", type=Path, default=MODELS / "tiny-large", help="the large model's folder")
    ap.add_argument("--p", type=float, default=0.3, help="probability of a hop to the large model per step")
    ap.add_argument("--tasks", default="tr_arithmetic", help="lm-eval generate_until tasks (both backends)")
    ap.add_argument("--ll-tasks", default="tr_arithmetic_mc",
                    help="lm-eval loglikelihood tasks (local-completions; '' for none)")  # fmt: skip
    ap.add_argument("--limit", type=int, default=0, help="documents per task (0: all)")
    ap.add_argument("--concurrent", type=int, default=4, help="lm-eval's num_concurrent")
    ap.add_argument("--device", default="cpu", help="tokenrouter serve --device")
    ap.add_argument(
        "--out", type=Path, default=None, help="folder for logs and lm-eval's results (default: temp)"
    )
    args = ap.parse_args(argv)

    for name in ("small", "large"):
        folder = getattr(args, name)
        if not (folder / "config.json").is_file():
            print(f"--{name} {folder}: not a model folder (no config.json)", file=sys.stderr)
            return 2
    missing = [m for m in ("lm_eval", "tenacity", "aiohttp") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"lm-eval's API backends are not installed ({', '.join(missing)} missing): "
              "pip install 'lm-eval[api]>=0.4.10'", file=sys.stderr)  # fmt: skip
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="lm_eval_check_"))
    out.mkdir(parents=True, exist_ok=True)
    plan = out / "lmeval.tr"
    plan.write_text(POLICY.format(small=args.small.resolve(), large=args.large.resolve(), p=args.p))
    # lm-eval loads the task's jsonl through `datasets`; nothing needs the network
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    failed = 0
    srv = Server(plan, ["--device", args.device], out / "serve.stderr", timeout=300)
    try:
        print(f"tokenrouter serve {plan.name} on {args.device}: {srv.url} (started in {srv.startup_s:.1f} s)")
        for backend, endpoint, extra in BACKENDS:
            failed += not run_backend(srv, backend, endpoint, extra, args.tasks, args, out, env)
        if args.ll_tasks:
            failed += not run_backend(srv, *LOGLIKELIHOOD, args.ll_tasks, args, out, env)
    finally:
        srv.stop()
        stop_live()
    print(f"logs and lm-eval results: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
