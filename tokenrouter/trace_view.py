"""`tokenrouter trace`: a saved routing trace as a picture: a standalone HTML file (no script, nothing fetched) and
a PNG (matplotlib). The inputs it reads:

- a response of the HTTP API (`choices[].routing`, saved as JSON), or a `routing` object alone;
- `tokenrouter generate PLAN --json` (per token its model and text) or `generate PLAN --trace`'s table;
- a `tokenrouter bench --json` report (per request its tokens per model; no token order), or a record of
  bench/matrix.py that holds one under `report`.

Tokens are coloured by the model that wrote them, a bar marks each change of writer (a hop), and the legend
gives each model's tokens and share.
"""

from __future__ import annotations

import ast
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenrouter.plotting import figure, model_colors

FORMATS = (
    "a response JSON (choices[].routing) or its routing object, `generate --json` or `generate --trace` output, "
    "or a `bench --json` report"
)


class TraceFormatError(ValueError):
    """A file that is none of the formats (the message names the file and what was expected)."""


@dataclass(slots=True)
class Trace:
    source: str  # what the file was: "response", "routing", "generate", "bench"
    models: list[str]  # in the order the file gives them (the plan's, where it has them)
    tokens_per_model: dict[str, int]
    hops: int
    writers: list[str] | None = None  # the model of each token, in order, where the file has them
    pieces: list[str] | None = None  # each token's text, where the file has it
    text: str | None = None  # the completion's text, where the file has it but not per token
    requests: list[dict[str, int]] = field(default_factory=list)  # bench: tokens per model of each request
    title: str = ""


def load(path: str | Path) -> Trace:
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFormatError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{p}: cannot read it as text: {e}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        table = _generate_table(raw)
        if table is None:
            raise TraceFormatError(
                f"{p}: not JSON, nor a `generate --trace` table; expected {FORMATS}"
            ) from None
        return table
    trace = _from_json(data) if isinstance(data, dict) else None
    if trace is None:
        raise TraceFormatError(f"{p}: not a saved trace; expected {FORMATS}")
    return trace


def _from_json(d: dict) -> Trace | None:
    if isinstance(d.get("report"), dict) and "per_request" in d["report"]:  # a bench/matrix.py record
        d = d["report"]
    if isinstance(d.get("per_request"), list) and isinstance(d.get("tokens_per_model"), dict):
        reqs = [dict(r.get("tokens_per_model") or {}) for r in d["per_request"] if r.get("ok", True)]
        return Trace("bench", _model_order(d["tokens_per_model"], reqs), _counts(d["tokens_per_model"]),
                     int(d.get("hops") or 0), requests=reqs, title=f"{d.get('model', '')}: {d.get('load', '')}")  # fmt: skip
    if isinstance(d.get("models"), list) and isinstance(d.get("token_ids"), list):  # generate --json
        writers = [str(x) for x in d["models"]]
        counts = d.get("tokens_per_model") or {x: writers.count(x) for x in dict.fromkeys(writers)}
        pieces = d.get("pieces") if isinstance(d.get("pieces"), list) else None
        return Trace("generate", list(counts), _counts(counts), len(d.get("hops") or []), writers=writers,
                     pieces=pieces, text=d.get("text"), title=str(d.get("policy", "")))  # fmt: skip
    if isinstance(d.get("choices"), list) and d["choices"] and isinstance(d["choices"][0], dict):
        c = d["choices"][0]
        if not isinstance(c.get("routing"), dict):
            return None
        text = c.get("text") if "text" in c else (c.get("message") or {}).get("content")
        t = _from_routing(c["routing"], "response")
        if t is not None:
            t.text, t.title = text, str(d.get("model", ""))
        return t
    return _from_routing(d, "routing")


def _from_routing(r: dict, source: str) -> Trace | None:
    if not isinstance(r.get("tokens_per_model"), dict):
        return None
    writers = r.get("trace") if isinstance(r.get("trace"), list) else None
    return Trace(source, list(r["tokens_per_model"]), _counts(r["tokens_per_model"]), int(r.get("hops") or 0),
                 writers=[str(x) for x in writers] if writers is not None else None)  # fmt: skip


_ROW = re.compile(r"^\s*(\d+)  (\S+)\s+(\d+)  (.*)$")
_SUMMARY = re.compile(r"^tokens: (.*); hops: (\d+); finish: \S+$")


def _generate_table(raw: str) -> Trace | None:
    """`generate --trace`: the text, then a row per token (`INDEX  MODEL  TOKEN_ID  'PIECE'`) and a summary line."""
    lines = raw.rstrip("\n").split("\n")
    if not lines or not (summary := _SUMMARY.match(lines[-1])):
        return None
    rows = []
    for line in reversed(lines[:-1]):
        m = _ROW.match(line)
        if m is None or (rows and int(m.group(1)) != int(rows[-1].group(1)) - 1):
            break
        rows.append(m)
        if m.group(1) == "0":
            break
    rows.reverse()
    if rows and rows[0].group(1) != "0":
        return None
    try:
        pieces = [ast.literal_eval(m.group(4)) for m in rows]
        counts = {k: int(v) for k, v in (x.rsplit(" ", 1) for x in summary.group(1).split(", "))}
    except (ValueError, SyntaxError):
        return None
    writers = [m.group(2) for m in rows]
    return Trace("generate", list(counts), counts, int(summary.group(2)), writers=writers, pieces=pieces)


def _counts(d: dict) -> dict[str, int]:
    return {str(k): int(v) for k, v in d.items()}


def _model_order(totals: dict, reqs: list[dict]) -> list[str]:
    return list(dict.fromkeys([*totals, *(x for r in reqs for x in r)]))


# ---- HTML -------------------------------------------------------------------------------------------------
_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1f2328; margin: 24px; max-width: 1100px; }
h1 { font-size: 18px; margin: 0 0 4px; } .sub { color: #656d76; margin-bottom: 12px; }
.legend span.sw { display: inline-block; width: 12px; height: 12px; border-radius: 3px; margin: 0 4px -1px 12px; }
.tokens { font: 13px/1.7 ui-monospace, monospace; white-space: pre-wrap; border: 1px solid #d0d7de;
          border-radius: 6px; padding: 10px; margin: 12px 0; }
.tok { border-radius: 2px; } .tok.hop { box-shadow: -2px 0 0 0 #000; }
.cell { display: inline-block; width: 10px; height: 14px; margin: 1px 0; }
.cell.hop { box-shadow: -2px 0 0 0 #000; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #d0d7de; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.bar { display: flex; height: 12px; margin: 2px 0; width: 600px; } .bar div { height: 100%; }
"""


def to_html(t: Trace, name: str = "") -> str:
    colors = model_colors(t.models)
    esc = html.escape
    legend = "".join(f'<span class="sw" style="background:{colors[x]}"></span>{esc(x)}' for x in t.models)
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{esc(name or 'routing trace')}"
        f"</title><style>{_CSS}</style></head><body>",
        f"<h1>Routing trace{': ' + esc(t.title) if t.title else ''}</h1>",
        f"<div class='sub'>{esc(name)} ({esc(t.source)})</div>",
        f"<div class='legend'>{legend}</div>",
    ]
    if t.writers is not None:
        parts.append("<div class='tokens'>" + "".join(_html_tokens(t, colors)) + "</div>")
        if t.pieces is None and t.text:
            parts.append(f"<div class='tokens'>{esc(t.text)}</div>")
    parts.append(_html_table(t, colors))
    if t.requests:
        parts.append(f"<h2 style='font-size:15px'>Each request's tokens by model ({len(t.requests)})</h2>")
        parts.extend(_html_bar(r, t.models, colors) for r in t.requests)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _html_tokens(t: Trace, colors: dict[str, str]) -> list[str]:
    """A span per token, coloured by its writer (its text, where the trace has it; else an empty cell); a hop
    starts a new writer's run. Joined without a newline: the box keeps the text's own white space."""
    esc = html.escape
    toks = []
    for i, x in enumerate(t.writers):
        hop = " hop" if i and x != t.writers[i - 1] else ""
        style = f"background:{colors.get(x, '#ccc')}55;border-bottom:2px solid {colors.get(x, '#999')}"
        if t.pieces is not None and i < len(t.pieces):
            toks.append(f'<span class="tok{hop}" style="{style}" title="{esc(x)}">{esc(t.pieces[i])}</span>')
        else:
            toks.append(
                f'<span class="cell{hop}" style="background:{colors.get(x, "#ccc")}" title="{esc(x)}"></span>'
            )
    return toks


def _html_table(t: Trace, colors: dict[str, str]) -> str:
    """Tokens and share per model, and the hops."""
    total = sum(t.tokens_per_model.values())
    rows = "".join(
        f"<tr><td><span style='color:{colors[x]}'>&#9632;</span> {html.escape(x)}</td><td>{n}</td>"
        f"<td>{100 * n / total if total else 0:.1f} %</td></tr>"
        for x, n in t.tokens_per_model.items()
    )
    return (f"<table><tr><th>model</th><th>tokens</th><th>share</th></tr>{rows}"
            f"<tr><td>hops</td><td>{t.hops}</td><td></td></tr></table>")  # fmt: skip


def _html_bar(r: dict[str, int], models: list[str], colors: dict[str, str]) -> str:
    """One request's tokens by model as a stacked bar."""
    n = sum(r.values()) or 1
    cells = "".join(
        f"<div style='width:{100 * r.get(x, 0) / n:.2f}%;background:{colors[x]}'></div>" for x in models
    )
    return f"<div class='bar' title='{html.escape(json.dumps(r))}'>{cells}</div>"


# ---- PNG --------------------------------------------------------------------------------------------------
TOKENS_PER_ROW = 64


def to_png(t: Trace, path: str | Path) -> None:
    """Tokens as a grid of cells (TOKENS_PER_ROW a row), or a bench report's requests as stacked bars."""
    from matplotlib.patches import Patch

    colors = model_colors(t.models)
    total = sum(t.tokens_per_model.values())
    handles = [
        Patch(color=colors[x], label=f"{x}: {n} ({100 * n / total if total else 0:.1f} %)")
        for x, n in t.tokens_per_model.items()
    ]
    if t.writers is not None:
        _png_tokens(t, path, colors, handles)
    else:
        _png_requests(t, path, colors, handles)


def _png_tokens(t: Trace, path: str | Path, colors: dict[str, str], handles: list) -> None:
    rows = max(1, -(-len(t.writers) // TOKENS_PER_ROW))
    with figure(path, (9, 1.4 + 0.22 * rows), dpi=110) as (_, ax):
        for i, x in enumerate(t.writers):
            r, c = divmod(i, TOKENS_PER_ROW)
            ax.add_patch(_rect(c, rows - 1 - r, colors.get(x, "#cccccc")))
            if i and x != t.writers[i - 1]:
                ax.plot([c, c], [rows - 1 - r, rows - r], color="black", lw=1.2)
        ax.set_xlim(0, TOKENS_PER_ROW)
        ax.set_ylim(0, rows)
        ax.set_axis_off()
        _finish(ax, t, handles)


def _png_requests(t: Trace, path: str | Path, colors: dict[str, str], handles: list) -> None:
    reqs = t.requests or [t.tokens_per_model]
    with figure(path, (9, 1.4 + 0.18 * len(reqs)), dpi=110) as (_, ax):
        for k, r in enumerate(reqs):
            n, left = sum(r.values()) or 1, 0.0
            for x in t.models:
                w = r.get(x, 0) / n
                ax.barh(len(reqs) - 1 - k, w, left=left, color=colors[x], height=0.8)
                left += w
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of the request's tokens")
        ax.set_yticks([])
        _finish(ax, t, handles)


def _rect(x: float, y: float, color: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y + 0.1), 1, 0.8, color=color, lw=0)


def _finish(ax, t: Trace, handles) -> None:
    ax.set_title(f"Routing trace{': ' + t.title if t.title else ''} ({t.hops} hops)", fontsize=10)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0), ncol=len(handles), fontsize=8,
              frameon=False)  # fmt: skip


# ---- the command ------------------------------------------------------------------------------------------
class TraceUsageError(ValueError):
    """Bad options (exit 2)."""


def command(file: str, output: str | None, png: str | None) -> list[str]:
    """`tokenrouter trace FILE [-o OUT.html] [--png OUT.png]`: the lines to print (what was written). Raises
    TraceUsageError for bad options, TraceFormatError for an unreadable input, OSError for an unwritable output."""
    from tokenrouter.outfile import check_output, write_replacing

    if output is None and png is None:
        raise TraceUsageError("give -o OUT.html, --png OUT.png, or both")
    if png is not None and Path(png).suffix.lower() != ".png":
        raise TraceUsageError(f"--png takes a .png file name, got {png!r}")
    for out in (output, png):
        if out is not None:
            check_output(out, [file])
    t = load(file)
    done = []
    if output is not None:
        write_replacing(output, to_html(t, Path(file).name), [file])
        done.append(f"wrote {output}")
    if png is not None:
        try:
            to_png(t, png)
        except ImportError:
            raise TraceUsageError("--png needs matplotlib (python3 -m pip install matplotlib)") from None
        done.append(f"wrote {png}")
    return done
