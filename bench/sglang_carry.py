"""What a device call must carry to run SGLang on the GPU machine, and how to make it fit in 64 MiB.

SGLang runs from `.whl/sglang-site.tar.xz` (built by `shared/device/sglang-bundle.sh`, 42.4 MiB; the whole of
it: SGLang's CUDA-graph capture JIT-compiles flashinfer's norm from its sources). SGLang's HTTP server (the
`sglang-only` baseline) also imports packages that neither the bundle nor the GPU image has; `--download`
fetches their wheels into `.whl/sgx/`. The repository's tracked files travel with every call, and with the
bundle they are over the limit, so `--set-aside` moves the largest tracked files that the SGLang run does not
use (example weights) out of the checkout for the call, and `--restore` puts them back.

    python bench/sglang_carry.py --download       # once: the HTTP server's wheels
    python bench/sglang_carry.py                  # what would travel, and what must be set aside
    python bench/sglang_carry.py --set-aside      # before the call ...
    python bench/sglang_carry.py --restore        # ... and after it
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / ".whl" / "sglang-site.tar.xz"
WHEELS = REPO / ".whl" / "sgx"
SMALL_WHEELS = ("lark-*.whl", "interegular-*.whl", "typing_extensions-*.whl")  # beside the bundle in .whl/
ASIDE = Path("/tmp/tokenrouter-aside")
LIMIT_MIB = 64.0
MARGIN_MIB = 2.0  # what a call may write into the tree before it travels (bytecode caches, logs)
# the packages SGLang 0.5.17's HTTP server imports that neither the bundle nor the H200 image has
SERVER_WHEELS = (
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "soundfile==0.14.0",
    "cffi==2.1.1",
    "pycparser==3.12",
    "python-multipart==0.0.34",
)
# never set aside: what the SGLang run reads (the package, the benchmarks, the tests it runs)
KEEP = ("tokenrouter/", "bench/", "tests/", "pyproject.toml")


def tree_files() -> list[Path]:
    """The files a call sends: tracked and untracked-not-ignored, as they are in the checkout now."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True).stdout  # fmt: skip
    return [REPO / p for p in out.decode().split("\0") if p and (REPO / p).is_file()]


def carried() -> list[Path]:
    small = [p for pat in SMALL_WHEELS for p in sorted((REPO / ".whl").glob(pat))]
    return [BUNDLE, *small, *sorted(WHEELS.glob("*.whl"))]


def mib(paths: list[Path]) -> float:
    return sum(p.stat().st_size for p in paths if p.exists()) / 2**20


def to_set_aside(files: list[Path], extra_mib: float) -> list[Path]:
    """The largest files outside KEEP, largest first, until the tree plus `extra_mib` fits."""
    over = mib(files) + extra_mib + MARGIN_MIB - LIMIT_MIB
    picked: list[Path] = []
    candidates = [f for f in files if not str(f.relative_to(REPO)).startswith(KEEP)]
    for f in sorted(candidates, key=lambda f: f.stat().st_size, reverse=True):
        if over <= 0:
            break
        picked.append(f)
        over -= f.stat().st_size / 2**20
    return picked


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    act = ap.add_mutually_exclusive_group()
    act.add_argument("--download", action="store_true", help=f"fetch the HTTP server's wheels into {WHEELS}")
    act.add_argument("--set-aside", action="store_true", help=f"move what must not travel to {ASIDE}")
    act.add_argument("--restore", action="store_true", help=f"move back what {ASIDE} holds")
    args = ap.parse_args(argv)
    if args.download:
        platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux2014_x86_64")]
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(WHEELS),
               *SERVER_WHEELS]  # fmt: skip
        return subprocess.run(cmd).returncode
    if args.restore:
        moved = [p for p in ASIDE.rglob("*") if p.is_file()] if ASIDE.exists() else []
        for p in moved:
            dst = REPO / p.relative_to(ASIDE)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(p, dst)
        shutil.rmtree(ASIDE, ignore_errors=True)
        print(f"restored {len(moved)} file(s)")
        return 0
    missing = [p for p in carried() if not p.exists()] + ([WHEELS] if not any(WHEELS.glob("*.whl")) else [])
    if missing:
        print("missing: " + ", ".join(str(p.relative_to(REPO)) for p in missing)
              + f"\n(the bundle: shared/device/sglang-bundle.sh; the wheels: {Path(__file__).name} --download)",
              file=sys.stderr)  # fmt: skip
        return 2
    files, extra = tree_files(), mib(carried())
    aside = to_set_aside(files, extra)
    print(
        f"tree {mib(files):.1f} MiB + carried {extra:.1f} MiB = {mib(files) + extra:.1f} MiB (limit {LIMIT_MIB:g})"
    )
    if args.set_aside:
        for f in aside:
            dst = ASIDE / f.relative_to(REPO)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(f, dst)
        print(f"set aside {len(aside)} file(s) ({mib([ASIDE / f.relative_to(REPO) for f in aside]):.1f} MiB) "
              f"in {ASIDE}; the tree is now {mib(tree_files()):.1f} MiB")  # fmt: skip
    elif aside:
        print(f"to set aside ({mib(aside):.1f} MiB): " + ", ".join(str(f.relative_to(REPO)) for f in aside))
    print("carry: " + ", ".join(str(p.relative_to(REPO)) for p in carried()[:4]) + ", .whl/sgx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
