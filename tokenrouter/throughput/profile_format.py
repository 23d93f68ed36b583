"""The profile file (`tokenrouter.profile/1`): measured step latencies L_i(b) and routing frequencies.

```json
{"format": "tokenrouter.profile/1",
 "policy": "bernoulli", "source_sha256": "<the plan's source.sha256>",
 "device": "cpu", "created": "2026-11-30T12:00:00Z",
 "step_ms": {"slm": {"1": 6.0, "2": 6.4, "4": 7.1}, "llm": {"1": 27.9}},
 "routing": {"slm": {"slm": 0.65, "llm": 0.35}, "llm": {"slm": 1.0}},
 "counts": {"slm": {"slm": 650, "llm": 350}, "llm": {"slm": 350}},
 "workload": {"prompts": 8, "max_tokens": 32}}
```
`step_ms` keys are batch sizes; `routing` rows sum to 1 (a model that never ran has no row);
`counts` are the observed decisions behind `routing`. Optional `colocation` (written by `tokenrouter profile
--colocation`, see `colocation.py`): per model sharing a GPU, `{"co_runners": ["llm"], "ms_per_share": 1.3,
"at_share": 0.87, "fit": {...}}`: its step takes `ms_per_share` ms longer per unit of its co-runners' summed
busy share above `at_share`, the share at which `step_ms` was measured (the server's busy share; `tune` puts
the term on the chain's own scale from `fit.step_change_ms` and `fit.thresholds`: `colocation.calibrate`).
Optional `alone_ms`: per model sharing a GPU, its step latencies `{batch: ms}` for the steps that no step of
the models beside it overlapped, and `beside_ms` for the others (both counted by the subservers and
read by `tokenrouter profile --from-metrics`; `--alone FILE` gives `alone_ms` from another profile instead).
The chain takes one or the other by state, with `step_ms` where a model has no `beside_ms`. A profile has
`colocation` or `alone_ms`, not both. Optional `prefill` (`profile --from-metrics`): per model, its prompt
prefills priced apart from `step_ms` (which then leaves those steps out), `{"steps": 4, "ms": 311.2,
"ms_per_token": 0.076, "ms_per_request": 38.9, "ms_per_visit": 77.8}`: the prefill steps, the ms they took beyond
a step of their batch size, and those ms per token the system committed, per request that ended and per first
run of a request on the model (`inputs.PrefillCost`; the last two only where the server counted them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenrouter.outfile import finite_json, write_replacing
from tokenrouter.throughput.inputs import StepLatency, check_prefill_ms

PROFILE_FORMAT = "tokenrouter.profile/1"


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the field."""


@dataclass(slots=True)
class Profile:
    policy: str
    source_sha256: str | None
    step_ms: dict[str, StepLatency]
    routing: dict[str, dict[str, float]]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    device: str = ""
    created: str = ""
    workload: dict[str, Any] = field(default_factory=dict)
    colocation: dict[str, dict[str, Any]] = field(default_factory=dict)
    alone_ms: dict[str, StepLatency] = field(default_factory=dict)
    beside_ms: dict[str, StepLatency] = field(default_factory=dict)
    prefill: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "policy": self.policy,
            "source_sha256": self.source_sha256,
            "device": self.device,
            "created": self.created,
            "step_ms": {m: {str(b): ms for b, ms in s.points} for m, s in self.step_ms.items()},
            "routing": self.routing,
            "counts": self.counts,
            "workload": self.workload,
            **({"colocation": self.colocation} if self.colocation else {}),
            **{
                key: {m: {str(b): ms for b, ms in s.points} for m, s in table.items()}
                for key, table in (("alone_ms", self.alone_ms), ("beside_ms", self.beside_ms))
                if table
            },
            **({"prefill": self.prefill} if self.prefill else {}),
        }


def write_profile(profile: Profile, path: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Write the profile as JSON (`outfile.write_replacing`: never over `inputs`, a `.tr` source or a folder)."""
    write_replacing(path, json.dumps(finite_json(profile.to_json()), indent=2) + "\n", inputs)


def read_profile(path: str | Path) -> Profile:
    p = Path(path)
    data = _read_json(p)

    def fail(where: str, msg: str) -> ProfileError:
        return ProfileError(f"{p}: field {where}: {msg}")

    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise fail("format", f'expected "{PROFILE_FORMAT}": not a tokenrouter profile')
    for key in ("policy", "step_ms", "routing"):
        if key not in data:
            raise fail(key, "missing")
    step, alone, beside = _latency_tables(data, fail)
    routing = _routing(data, fail)
    colocation = _colocation(data, fail)
    if colocation and alone:
        raise fail("alone_ms", "a profile gives either colocation terms or latencies alone, not both")
    return Profile(
        policy=str(data["policy"]),
        source_sha256=data.get("source_sha256"),
        step_ms=step,
        routing=routing,
        counts=data.get("counts") or {},
        device=str(data.get("device", "")),
        created=str(data.get("created", "")),
        workload=data.get("workload") or {},
        colocation=colocation,
        alone_ms=alone,
        beside_ms=beside,
        prefill=_prefill(data, step, fail),
    )


def _read_json(p: Path):
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{p}: no such profile file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{p}: cannot read profile: {e}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{p}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None


def _latency_tables(data: dict, fail) -> tuple[dict[str, StepLatency], ...]:
    """The step latencies, and those alone and beside (for models with step latencies; beside with alone)."""
    step = _latencies(data, "step_ms", fail)
    alone = _latencies(data, "alone_ms", fail) if data.get("alone_ms") else {}
    beside = _latencies(data, "beside_ms", fail) if data.get("beside_ms") else {}
    for key, table in (("alone_ms", alone), ("beside_ms", beside)):
        for m in table:
            if m not in step:
                raise fail(f"{key}.{m}", "a model without step_ms")
    for m in beside:
        if m not in alone:
            raise fail(f"beside_ms.{m}", "a model without alone_ms")
    return step, alone, beside


def _latencies(data: dict, key: str, fail) -> dict[str, StepLatency]:
    out: dict[str, StepLatency] = {}
    if not isinstance(data[key], dict):
        raise fail(key, "expected an object")
    for m, table in data[key].items():
        if not isinstance(table, dict) or not table:
            raise fail(f"{key}.{m}", "expected a non-empty object {batch: ms}")
        try:
            out[m] = StepLatency(tuple((int(b), ms) for b, ms in table.items()))
        except (TypeError, ValueError) as e:
            raise fail(f"{key}.{m}", str(e)) from None
    return out


def _routing(data: dict, fail) -> dict[str, dict[str, float]]:
    routing: dict[str, dict[str, float]] = {}
    if not isinstance(data["routing"], dict):
        raise fail("routing", "expected an object")
    for m, row in data["routing"].items():
        ok = isinstance(row, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in row.values()
        )
        if not ok:
            raise fail(f"routing.{m}", "expected an object {target: probability in [0, 1]}")
        if not math.isclose(sum(row.values()), 1.0, abs_tol=1e-6):
            raise fail(f"routing.{m}", f"probabilities sum to {sum(row.values()):.6g}, expected 1")
        routing[m] = {k: float(v) for k, v in row.items()}
    return routing


def _colocation(data: dict, fail) -> dict:
    colocation = data.get("colocation") or {}
    if not isinstance(colocation, dict):
        raise fail("colocation", "expected an object {model: term}")
    for m, term in colocation.items():
        ok = (
            isinstance(term, dict)
            and isinstance(term.get("co_runners"), list)
            and bool(term["co_runners"])
            and all(isinstance(x, str) for x in term["co_runners"])
            and all(
                isinstance(term.get(k), (int, float)) and not isinstance(term[k], bool) and math.isfinite(term[k])
                and term[k] >= 0 for k in ("ms_per_share", "at_share")
            )
        )  # fmt: skip
        if not ok:
            raise fail(
                f"colocation.{m}",
                'expected {"co_runners": [model, ...], "ms_per_share": ms >= 0, "at_share": >= 0}',
            )
    return colocation


def _prefill(data: dict, step: dict, fail) -> dict:
    prefill = data.get("prefill") or {}
    if not isinstance(prefill, dict):
        raise fail("prefill", "expected an object {model: cost}")
    for m, cost in prefill.items():
        if m not in step:
            raise fail(f"prefill.{m}", "a model without step_ms")
        try:
            if not isinstance(cost, dict) or "ms_per_token" not in cost:
                raise ValueError(
                    'expected {"ms_per_token": ms >= 0, "ms_per_visit": ms >= 0 (optional), ...}'
                )
            for key in ("ms_per_token", "ms_per_request", "ms_per_visit"):
                if key in cost:
                    check_prefill_ms(key, cost[key])
        except ValueError as e:
            raise fail(f"prefill.{m}", str(e)) from None
    return prefill
