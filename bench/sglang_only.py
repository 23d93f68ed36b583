"""The `sglang-only` baseline: SGLang's own server on the large model, loaded by `tokenrouter bench`'s load.

Starts `python -m sglang.launch_server` (SGLang's HTTP server: its scheduler, continuous batching, radix cache,
CUDA graphs) on one model folder, waits until it answers, runs the same closed-loop load as `tokenrouter bench`
(`tokenrouter.loadgen.bench`: synthetic token-id prompts, streamed /v1/completions, ignore_eos, fixed output
length) at each concurrency, prints the report, and stops the server it started.

    python bench/sglang_only.py --model-path models/qwen3-8b --load-format dummy -c 4 -c 8 --json out/sglang_only.json

SGLang is optional. Where it is absent the script says so and exits with status 3 before starting anything.
`--sglang-path DIR` puts DIR (an unpacked `sglang-site` bundle, docs/sglang.md) on the server's PYTHONPATH only.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from served import exit_on_sigterm  # noqa: E402

from tokenrouter.loadgen.bench import LoadSpec, format_report, run_load  # noqa: E402

SGLANG_VERSION = "0.5.17"
EXIT_NO_SGLANG = 3


def sglang_available(sglang_path: str | None) -> str | None:
    """None when SGLang can be started, else why not."""
    if sglang_path:
        if not (Path(sglang_path) / "sglang" / "launch_server.py").is_file():
            return f"--sglang-path {sglang_path} holds no sglang package (sglang/launch_server.py)"
        return None
    if importlib.util.find_spec("sglang") is None:
        return (
            f"SGLang is not installed here: pip install 'sglang=={SGLANG_VERSION}' on a CUDA machine, or pass "
            "--sglang-path with an unpacked bundle (docs/sglang.md)"
        )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", args.model_path,
           "--load-format", args.load_format, "--attention-backend", "triton", "--dtype", args.dtype,
           "--host", "127.0.0.1", "--port", str(port), "--random-seed", "0", "--log-level", "warning"]  # fmt: skip
    if args.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(args.mem_fraction_static)]
    if args.max_running_requests is not None:
        cmd += ["--max-running-requests", str(args.max_running_requests)]
    return cmd + list(args.server_arg or [])


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the SGLang server exited with status {proc.returncode} while starting")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the SGLang server did not answer within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server this script started (its own process group), politely first."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True, help="HF-format model folder (the large model)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("-c", "--concurrency", type=int, action="append", help="repeatable (default 4)")
    p.add_argument("-n", "--num-prompts", type=int, default=32)
    p.add_argument("--rounds", type=int, help="requests per run = ROUNDS x concurrency (instead of -n)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--warmup-len", type=int, default=0,
                   help="before each run, `concurrency` requests of this many tokens (0: none)")  # fmt: skip
    p.add_argument("--vocab-high", type=int, default=200, help="synthetic prompt ids are drawn below this")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--sglang-path", help="unpacked SGLang bundle, put on the server's PYTHONPATH only")
    p.add_argument(
        "--server-arg", action="append", help="extra argument for sglang.launch_server (repeatable)"
    )
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--json", dest="json_out", help="write the reports here")
    return p.parse_args(argv)


def load_specs(args: argparse.Namespace) -> list[tuple[LoadSpec | None, LoadSpec]]:
    """Per concurrency: (warm-up or None, measured run). ValueError for bad numbers."""
    out = []
    for c in args.concurrency or [4]:
        num = args.rounds * c if args.rounds else args.num_prompts
        common = dict(url="", concurrency=c, prompt_len=args.prompt_len, vocab_high=args.vocab_high,
                      progress=False)  # fmt: skip
        warm = LoadSpec(num_prompts=c, output_len=args.warmup_len, **common) if args.warmup_len else None
        out.append((warm, LoadSpec(num_prompts=num, output_len=args.output_len, **common)))
    return out


def start_server(args: argparse.Namespace, port: int, **popen) -> subprocess.Popen:
    """SGLang's server (`server_command`) started in a session of its own, `args.sglang_path` on its PYTHONPATH
    only; `popen`: more arguments for `subprocess.Popen` (e.g. where its output goes)."""
    env = dict(os.environ)
    if args.sglang_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.sglang_path, env.get("PYTHONPATH")]))
    return subprocess.Popen(server_command(args, port), env=env, start_new_session=True, **popen)


def run(args: argparse.Namespace, on_start=None) -> tuple[list[dict], float]:
    """Start the server, run every load, stop it: (reports, server start-up seconds). `on_start(pgid)` is
    called with the server's process group once it is started. Raises RuntimeError if it never answers."""
    specs = load_specs(args)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print("starting:", " ".join(server_command(args, port)), file=sys.stderr)
    started = time.perf_counter()
    proc = start_server(args, port)
    if on_start is not None:
        on_start(proc.pid)
    reports = []
    try:
        wait_ready(proc, url, args.start_timeout)
        startup_s = time.perf_counter() - started
        print(f"SGLang server ready after {startup_s:.0f} s", file=sys.stderr)
        for warm, spec in specs:
            if warm is not None:
                warm.url = url
                asyncio.run(run_load(warm))
            spec.url = url
            report = asyncio.run(run_load(spec)) | {
                "mode": "sglang-only",
                "sglang": SGLANG_VERSION,
                "server_startup_s": startup_s,  # from the server's start to its first answer
            }
            print(f"\n## sglang-only, concurrency {spec.concurrency}\n{format_report(report)}")
            reports.append(report)
    finally:
        stop(proc)
    return reports, startup_s


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(args.model_path, "config.json").is_file():
        print(f"error: {args.model_path}: not a model folder (no config.json)", file=sys.stderr)
        return 2
    why = sglang_available(args.sglang_path)
    if why:
        print(f"sglang-only baseline skipped: {why}", file=sys.stderr)
        return EXIT_NO_SGLANG
    try:
        load_specs(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        reports, _ = run(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(reports, indent=2))
    return 1 if any(r["failed"] for r in reports) else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_on_sigterm)  # `timeout`'s SIGTERM stops the server in `run`'s finally
    sys.exit(main())
