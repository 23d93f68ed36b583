"""Per model of each std-serving row: steps, tokens presented per step (what the subservers counted before
d7a5259), tokens run per step (presented less `tokenrouter_prefix_matched_tokens`), and ms per step, from the
records' metric scrapes. Usage: python3 docs/raw/run-a12/stdtok.py RESULTS.tar.gz ... (thirty-ninth session)."""

import json
import sys
import tarfile


def delta(after: dict, before: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


for path in sys.argv[1:]:
    with tarfile.open(path) as tf:
        for member in tf.getmembers():
            if "record-std-serving" not in member.name:
                continue
            rec = json.load(tf.extractfile(member))
            after, before = rec["metrics_after"], rec["metrics_before"]
            parts = []
            for x in ("slm", "llm"):
                steps = delta(after, before, f'tokenrouter_steps_total{{model="{x}"}}')
                counted = delta(after, before, f'tokenrouter_step_tokens_total{{model="{x}"}}')
                matched = delta(after, before, f'tokenrouter_prefix_matched_tokens{{model="{x}"}}')
                seconds = delta(after, before, f'tokenrouter_step_seconds_total{{model="{x}"}}')
                parts.append(
                    f"{x}: {steps:.0f} steps, presented {counted / steps:.0f} / run {(counted - matched) / steps:.1f} "
                    f"tokens per step, matched {matched:.0f}, {1000 * seconds / steps:.2f} ms per step"
                )
            print(
                f"{path.split('/')[-1]} N={rec['n']} prompt={rec.get('prompt_len', 32)}: " + "; ".join(parts)
            )
