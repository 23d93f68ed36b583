"""`generate --device cpu` (the in-process executor) with `gpus: [0, 1]`: the model runs as two gloo ranks and
writes the tokens, with the same routing, as the policy with the model on one rank."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.runtime.messages import SamplingSpec
from tokenrouter.runtime.offline import load_offline, plan_from_path

MODELS = Path(__file__).resolve().parents[3] / "examples" / "models"
POLICY = f"""\
policy tpmix "both tiny models write; the large one on {{gpus}}"
model slm = "{MODELS / "tiny-small"}" {{{{ gpu: 0, batch: 2 }}}}
model llm = "{MODELS / "tiny-large"}" {{{{ gpus: {{gpus}}, batch: 1 }}}}
entry slm
route slm {{{{
  when uniform() < 0.3 -> llm
}}}}
route llm {{{{
  when uniform() < 0.7 -> slm
}}}}
"""
PROMPTS = [[1, 2, 3, 4], [9, 8, 7], [5] * 6, [11, 12]]
SAMPLING = [SamplingSpec(seed=i, max_tokens=12, ignore_eos=True) for i in range(len(PROMPTS))]


def run(tmp_path: Path, gpus: str, ranks: int) -> list[tuple[list[int], list[str], str | None]]:
    path = tmp_path / f"tp{ranks}.tr"
    path.write_text(POLICY.format(gpus=gpus))
    ex = load_offline(plan_from_path(str(path)), "cpu")
    try:
        group = getattr(ex.schedulers["llm"].engine, "tp", None)
        assert (group.size if group is not None else 1) == ranks
        return [(r.token_ids, r.models, r.error) for r in ex.generate(PROMPTS, SAMPLING)]
    finally:
        for s in ex.schedulers.values():
            if (close := getattr(s.engine, "close_group", None)) is not None:
                close()


def test_two_ranks_generate_as_one(tmp_path):
    one, two = run(tmp_path, "[0]", 1), run(tmp_path, "[0, 1]", 2)
    assert two == one
    assert all(err is None for _, _, err in two)
    models = [m for _, ms, _ in two for m in ms]
    assert "llm" in models and "slm" in models
