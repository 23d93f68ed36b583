"""Make docs/img/playground.png: the playground page on the demo policy (examples/r2r_kd.tr, the shipped trained
models) after a chat answer streamed in, in a headless Chromium.

    python3 tests/runtime/frontend/playground_screenshot.py [OUT.png]
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

from cdp import Browser, find_chromium
from frontend_helpers import ROOT, Server

PROMPT = "def read_lines(path):"


def main(out: Path) -> None:
    exe = find_chromium()
    if exe is None:
        raise SystemExit("no chromium installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        srv = Server(ROOT / "examples" / "r2r_kd.tr", log_dir=Path(tmp))
        b = Browser(exe, width=1100, height=700)
        try:
            b.goto(f"{srv.url}/")
            b.wait_for("document.body.dataset.ready === '1'")
            b.evaluate(
                "document.getElementById('max_tokens').value = '90';"
                "document.getElementById('temperature').value = '0.8'; document.getElementById('seed').value = '3'"
            )
            b.evaluate(
                f"document.getElementById('prompt').value = {PROMPT!r}; document.getElementById('send').click()"
            )
            b.wait_for("document.body.dataset.done === '1'", timeout=120)
            out.parent.mkdir(parents=True, exist_ok=True)
            b.screenshot(str(out))
        finally:
            b.close()
            srv.stop(signal.SIGINT)
    print(f"{out}: {out.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img" / "playground.png")
