"""The set-up is reproducible: constraints.txt pins every direct dependency to a version the package's own
ranges accept, and every place that installs the package (README, Makefile, .ci/run) installs through it."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "python3 -m pip install -q -c constraints.txt -e '.[dev]'"


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            spec = list(req.specifier)
            assert len(spec) == 1 and spec[0].operator == "==", f"not a pin: {line}"
            out[canonicalize_name(req.name)] = spec[0].version
    return out


def test_every_direct_dependency_is_pinned_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    pinned = pins()
    for req in direct:
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])
        if name != "torch":  # torch's range is wide on purpose (2.11-2.13 and the next)
            assert any(s.operator in ("<", "<=") for s in req.specifier), f"{req} has no upper bound"
    assert pinned["torch"] == "2.13.0"


def test_every_install_goes_through_the_constraints():
    for path, text in [("README.md", INSTALL.replace(" -q", "")), ("Makefile", INSTALL.replace(" -q", "")),
                       (".ci/run", INSTALL)]:  # fmt: skip
        body = (ROOT / path).read_text()
        assert text in body, f"{path} does not install with the constraints"
        assert "pip install -e" not in body and "pip install -q -e" not in body, path
