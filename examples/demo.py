"""The README's demo: serve a routing policy on the trained demo pair and ask it for code, with the openai client.

    python3 examples/demo.py [POLICY.tr] [--prompt TEXT] [--max-tokens N]

It starts `tokenrouter serve POLICY` (default: examples/r2r_kd.tr — py-small-kd, distilled from py-large,
writes, and py-large rewrites the tokens where the trained router expects the two to disagree) on a free
port, sends one completion and one chat request through the unmodified `openai` client, prints the text and
which model wrote which tokens, and shuts the server down with Ctrl-C's signal. Everything runs offline on
the CPU.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PROMPT = "import os\n\n\ndef read_lines(path):\n"


def start_server(policy: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "tokenrouter.cli", "serve", str(policy), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    for line in proc.stdout:
        print(line, end="")
        if " at http://" in line:
            return proc, line.rsplit(" at ", 1)[1].strip()
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"the server did not start (exit status {proc.wait()})")


def runs(trace: list[str]) -> str:
    """['slm', 'slm', 'llm', 'slm'] -> 'slm×2 llm×1 slm×1'"""
    return " ".join(f"{name}×{len(list(group))}" for name, group in itertools.groupby(trace))


def show(title: str, text: str, routing: dict) -> None:
    print(f"\n--- {title} ---\n{text}\n")
    counts = routing["tokens_per_model"]
    total = sum(counts.values()) or 1
    shares = ", ".join(f"{name} {n} ({100 * n / total:.0f}%)" for name, n in counts.items())
    print(f"tokens by model: {shares}; hops: {routing['hops']}")
    print(f"who wrote them, in order: {runs(routing.get('trace', []))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policy", nargs="?", default=str(HERE / "r2r_kd.tr"))
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    from openai import OpenAI

    proc, url = start_server(Path(args.policy))
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        model = client.models.list().data[0].id
        extra = {"return_routing_trace": True}
        done = client.completions.create(
            model=model, prompt=args.prompt, max_tokens=args.max_tokens, temperature=0, extra_body=extra
        )
        choice = done.choices[0]
        show("completion", args.prompt + choice.text, choice.model_extra["routing"])
        chat = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "def fibonacci(n):"}],
            max_tokens=args.max_tokens,
            temperature=0,
            extra_body=extra,
        )
        choice = chat.choices[0]
        show("chat", choice.message.content, choice.model_extra["routing"])
        print(
            f"\nusage of the chat request: {chat.usage.prompt_tokens} prompt + {chat.usage.completion_tokens} completion tokens"
        )
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=60)
    if status != 0:
        raise SystemExit(f"the server exited with status {status}")
    print("server shut down cleanly")


if __name__ == "__main__":
    main()
