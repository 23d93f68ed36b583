"""Make the SGLang bundle small enough to travel with this repository to the GPU machine (64 MiB per call).

`shared/device/sglang-bundle.sh` writes `.whl/sglang-site.tar.xz` (about 42 MiB); with this repository's
tracked files (about 28 MiB, mostly example weights) that is over the 64 MiB a device call carries. This
script repacks it without what the ModelRunner seam and SGLang's server never load at run time:
- `flashinfer/data/{cutlass,cccl,csrc,include,spdlog}`: C++/CUDA headers and sources for flashinfer's JIT
  builds (the triton attention backend and greedy sampling do not compile flashinfer kernels);
- the debug information of `xgrammar/libxgrammar_bindings.so` (`strip --strip-debug`: 51 MB -> ~2 MB; its
  code and dynamic symbols stay; SGLang imports xgrammar when `server_args` is imported).
It writes `.whl/sglang-site-slim.tar.xz` and prints what would travel: tracked + untracked files + the bundle.

    python bench/sglang_slim_bundle.py        # then carry .whl/sglang-site-slim.tar.xz
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / ".whl" / "sglang-site.tar.xz"
DST = REPO / ".whl" / "sglang-site-slim.tar.xz"
JIT_DIRS = ("cutlass", "cccl", "csrc", "include", "spdlog")
DEBUG_SO = ("xgrammar/libxgrammar_bindings.so",)
LIMIT_MIB = 64.0


def tree_mib() -> float:
    """Bytes of the files a device call sends without carries: tracked and untracked-not-ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout  # fmt: skip
    names = [n for n in out.decode().split("\0") if n]
    return sum((REPO / n).stat().st_size for n in names if (REPO / n).is_file()) / 2**20


def main() -> int:
    if not SRC.is_file() or SRC.stat().st_size == 0:
        print(f"error: {SRC} is missing: run shared/device/sglang-bundle.sh first", file=sys.stderr)
        return 2
    if shutil.which("strip") is None or shutil.which("xz") is None:
        print("error: needs `strip` (binutils) and `xz`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        subprocess.run(["tar", "-xJf", str(SRC), "-C", str(site)], check=True)
        for d in JIT_DIRS:
            shutil.rmtree(site / "flashinfer" / "data" / d, ignore_errors=True)
        for so in DEBUG_SO:
            if (site / so).is_file():
                subprocess.run(["strip", "--strip-debug", str(site / so)], check=True)
        part = DST.with_suffix(".xz.part")
        with open(part, "wb") as f:
            tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(site), "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=f, check=True)
            if tar.wait() != 0:
                raise RuntimeError("tar failed")
        part.replace(DST)
    with tarfile.open(DST) as t:  # readable, and what it holds
        names = t.getnames()
    bundle = DST.stat().st_size / 2**20
    tree = tree_mib()
    total = tree + bundle
    print(f"{DST.relative_to(REPO)}: {bundle:.1f} MiB ({len(names)} entries); repository files {tree:.1f} MiB; "
          f"together {total:.1f} MiB of {LIMIT_MIB:.0f} (plus any other carries)")  # fmt: skip
    return 0 if total < LIMIT_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
