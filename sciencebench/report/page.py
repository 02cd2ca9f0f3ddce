"""The report as one self-contained HTML page: tables and inline SVG charts, no script, no external URL.

Every string that comes from a job's files (task ids, job, agent and model
names, image references, versions) is untrusted and goes through `_e`
(HTML-escaped, quotes too) wherever it lands: text, attribute or SVG. The
page's Content-Security-Policy allows nothing but its own style element (by
hash): no script, no image, no font, no fetch, no form. Charts use SVG
presentation attributes, never a `style` attribute (which the policy refuses).
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Sequence
from datetime import datetime

from sciencebench.core.stats import Spend, duration_text
from sciencebench.report.numbers import FAILURE_CLASSES, Column, Interval, Report, RunCard

# One colour per column, in turn.
PALETTE = ("#3b6fb6", "#d9822b", "#3a9a5b", "#b6443b", "#7b5ea7", "#8c6d46", "#c45ca2", "#6b6b6b")
LABEL_MAX_CHARS = 40
CHART_WIDTH = 760
LABEL_WIDTH = 300
BAR_HEIGHT = 16
ROW_GAP = 6

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.r0 { background: #f4c7c3; } .r1 { background: #fbe3c4; } .r2 { background: #fff4c2; }
.r3 { background: #dcedc2; } .r4 { background: #b7e1cd; } .none { background: #eee; color: #888; }
.flaky { background: #fff0f0; border: 2px solid #c0392b; padding: 8px 12px; }
.note { color: #555; } code { font-size: 12px; word-break: break-all; }
svg text { font: 12px system-ui, sans-serif; }
"""


def _e(value: object) -> str:
    """Untrusted text, escaped for an HTML text node or a double-quoted attribute."""
    return html.escape(str(value), quote=True)


def _short(text: str) -> str:
    return text if len(text) <= LABEL_MAX_CHARS else text[: LABEL_MAX_CHARS - 1] + "…"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(interval: Interval | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def _seconds(value: float) -> str:
    """`0.4s` under a minute (a fast trial is not `0s`), else `3m05s` as everywhere."""
    return f"{value:.1f}s" if value < 60 else duration_text(value)


def _colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


class _Bar:
    """One bar of a horizontal bar chart: its label, value, interval and colour."""

    def __init__(self, label: str, value: float, colour: str, interval: Interval | None = None) -> None:
        self.label, self.value, self.colour, self.interval = label, value, colour, interval


def _bar_chart(chart_id: str, title: str, bars: Sequence[_Bar], top: float, unit: str = "") -> str:
    """A horizontal bar chart in inline SVG, with interval whiskers where a bar has one."""
    if not bars:
        return f'<p class="note">{_e(title)}: nothing to chart.</p>'
    top = top if top > 0 else 1.0
    plot = CHART_WIDTH - LABEL_WIDTH - 70
    step = BAR_HEIGHT + ROW_GAP
    height = 28 + step * len(bars) + 20
    parts = [
        f'<svg id="{_e(chart_id)}" class="chart" role="img" width="{CHART_WIDTH}" height="{height}" '
        f'viewBox="0 0 {CHART_WIDTH} {height}">',
        f"<title>{_e(title)}</title>",
        f'<text x="0" y="16" font-weight="bold">{_e(title)}</text>',
        f'<line x1="{LABEL_WIDTH}" y1="24" x2="{LABEL_WIDTH}" y2="{height - 16}" stroke="#888"/>',
    ]
    for i, bar in enumerate(bars):
        y = 28 + i * step
        width = max(bar.value, 0.0) / top * plot
        value = f"{bar.value:.3f}{unit}" if unit != "s" else _seconds(bar.value)
        parts += [
            f'<text x="{LABEL_WIDTH - 6}" y="{y + 12}" text-anchor="end">{_e(_short(bar.label))}'
            f"<title>{_e(bar.label)}</title></text>",
            f'<rect x="{LABEL_WIDTH}" y="{y}" width="{width:.1f}" height="{BAR_HEIGHT}" '
            f'fill="{bar.colour}"/>',
        ]
        end = width
        if bar.interval is not None:
            low, high = (LABEL_WIDTH + max(v, 0.0) / top * plot for v in bar.interval)
            mid, y0, y1 = y + BAR_HEIGHT / 2, y + 3, y + BAR_HEIGHT - 3
            parts += [
                f'<line x1="{low:.1f}" y1="{mid}" x2="{high:.1f}" y2="{mid}" stroke="#111" '
                'stroke-width="1.5"/>',
                f'<line x1="{low:.1f}" y1="{y0}" x2="{low:.1f}" y2="{y1}" stroke="#111"/>',
                f'<line x1="{high:.1f}" y1="{y0}" x2="{high:.1f}" y2="{y1}" stroke="#111"/>',
            ]
            end = max(end, high - LABEL_WIDTH)
        parts.append(f'<text x="{LABEL_WIDTH + end + 6:.1f}" y="{y + 12}">{_e(value)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int = 1) -> str:
    """A table of already-escaped cells; cells from column `numeric_from` on are right-aligned."""
    lines = ["<table>", "<tr>" + "".join(f"<th>{cell}</th>" for cell in head) + "</tr>"]
    for row in rows:
        cells = (
            f'<td class="num">{c}</td>' if i >= numeric_from else f"<td>{c}</td>" for i, c in enumerate(row)
        )
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _flaky(report: Report) -> str:
    if not report.flaky:
        return '<p class="flaky">No flaky task: each task got one reward on all its counted attempts.</p>'
    rows = [
        [_e(f.job_name), _e(f"task_{f.task.task_id}"), _e(f.task.model or "-"),
         _e(", ".join(f"#{a}: {r:g}" for a, r in zip(f.task.attempts, f.task.rewards, strict=True)))]
        for f in report.flaky
    ]  # fmt: skip
    intro = (
        f"<p><strong>{len(report.flaky)} flaky task(s)</strong>: the reward differs across attempts of "
        "one agent and model (counted attempts only).</p>"
    )
    return (
        f'<div class="flaky" id="flaky">{intro}{_table(["job", "task", "model", "rewards"], rows, 4)}</div>'
    )


def _scores(report: Report) -> str:
    columns = report.columns
    bars = [
        _Bar(c.label, c.mean_reward, _colour(i), c.mean_interval)
        for i, c in enumerate(columns)
        if c.mean_reward is not None
    ]
    parts = [_bar_chart("chart-mean-reward", "mean reward (95% bootstrap interval over tasks)", bars, 1.0)]
    k_bars = [
        _Bar(f"{c.label} pass@{k}", value, _colour(i), c.pass_at_k_interval.get(k))
        for i, c in enumerate(columns)
        for k, value in sorted(c.pass_at_k.items())
    ]
    parts.append(_bar_chart("chart-pass-at-k", "pass@k (95% bootstrap interval over tasks)", k_bars, 1.0))
    rows = [
        [_e(c.label), str(c.n_tasks), str(c.n_counted), _num(c.mean_reward), _interval(c.mean_interval),
         _pass_at_k_text(c)]
        for c in columns
    ]  # fmt: skip
    head = ["job: agent (model)", "tasks", "counted trials", "mean reward", "95% interval", "pass@k"]
    return "\n".join(parts) + _table(head, rows)


def _pass_at_k_text(column: Column) -> str:
    values = sorted(column.pass_at_k.items())
    text = "; ".join(f"pass@{k} {v:.3f} {_interval(column.pass_at_k_interval.get(k))}" for k, v in values)
    return text or "- (rewards not all 0 or 1)"


def _bucket(mean: float) -> str:
    return f"r{min(int(mean * 5), 4)}"


def _matrix(report: Report) -> str:
    flaky = {f.task.task_id for f in report.flaky}
    head = ["task"] + [_e(c.label) for c in report.columns]
    lines = ['<table id="matrix">', "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for row in report.tasks:
        mark = " (flaky)" if row.task_id in flaky else ""
        cells = [f"<td>{_e(f'task_{row.task_id}')}{mark}</td>"]
        for cell in row.cells:
            if cell is None or cell.mean is None:
                cells.append('<td class="none">-</td>')
            else:
                rewards = ", ".join(f"{r:g}" for r in cell.rewards)
                cells.append(f'<td class="num {_bucket(cell.mean)}">{cell.mean:.2f} ({_e(rewards)})</td>')
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _spend_cells(spend: Spend) -> list[str]:
    cost = "-" if spend.cost_usd is None else f"${spend.cost_usd:.4f}"
    tokens = (
        "-" if not spend.n_with_tokens else f"{spend.n_input_tokens or 0:,} + {spend.n_output_tokens or 0:,}"
    )
    return [cost, tokens, f"{spend.n_priced} of {spend.n_trials}"]


def _cost(report: Report) -> str:
    columns = report.columns
    priced = [(i, c) for i, c in enumerate(columns) if c.cost_per_solved is not None]
    top = max((c.cost_per_solved or 0.0 for _, c in priced), default=0.0)
    bars = [_Bar(c.label, c.cost_per_solved or 0.0, _colour(i)) for i, c in priced]
    chart = _bar_chart("chart-cost", "cost per solved task (USD)", bars, top, unit=" $")
    rows = [
        [_e(c.label), str(c.n_solved), *_spend_cells(c.spend),
         "-" if c.cost_per_solved is None else f"${c.cost_per_solved:.4f}",
         "-" if c.tokens_per_solved is None else f"{c.tokens_per_solved:,.0f}"]
        for c in columns
    ]  # fmt: skip
    head = ["job: agent (model)", "solved tasks", "cost", "tokens (in + out)", "priced trials",
            "cost per solved task", "tokens per solved task"]  # fmt: skip
    return chart + _table(head, rows)


def _durations(report: Report) -> str:
    bars = []
    for row in report.tasks:
        for i, cell in enumerate(row.cells):
            if cell is not None and cell.duration_sec is not None:
                label = f"task_{row.task_id} · {report.columns[i].label}"
                bars.append(_Bar(label, cell.duration_sec, _colour(i)))
    top = max((bar.value for bar in bars), default=0.0)
    return _bar_chart("chart-duration", "mean duration per task (seconds, all trials)", bars, top, unit="s")


def _failures(report: Report) -> str:
    names = {"provider_error": "provider", "registry": "registry (pull)", "infrastructure": "infrastructure",
             "not_started": "not started", "model_error": "the model's errors (counted)"}  # fmt: skip
    head = ["job: agent (model)", *(names[name] for name in FAILURE_CLASSES)]
    rows = [
        [_e(c.label), *(str(c.failures.get(name, 0)) for name in FAILURE_CLASSES)] for c in report.columns
    ]
    note = (
        '<p class="note">Provider, registry and infrastructure failures and trials never started are not the '
        "model's: they are left out of every number above.</p>"
    )
    return note + _table(head, rows)


def _card(card: RunCard) -> str:
    missing = ", ".join(card.missing[:50]) + (
        f" and {len(card.missing) - 50} more" if len(card.missing) > 50 else ""
    )
    baked = "".join(
        f"<li>task_{_e(t)}: <code>{_e(image)}</code></li>" for t, image in card.agent_images.items()
    )
    items = [
        ("job id", _e(card.job_id)),
        ("job directory", f"<code>{_e(card.job_dir)}</code>"),
        ("created", _e(card.created_at.isoformat())),
        ("selection sha256", f"<code>{_e(card.selection_sha256)}</code>"),
        ("agent", _e(card.agent)),
        ("models", _e(", ".join(card.models) or "-")),
        ("attempts, concurrency", f"{card.n_attempts}, {card.n_concurrent}"),
        ("images", "<ul>" + "".join(f"<li><code>{_e(ref)}</code></li>" for ref in card.image_refs) + "</ul>"),
        ("baked agent images", f"<ul>{baked}</ul>" if baked else "-"),
        (
            "sciencebench version",
            _e(card.sciencebench_version or "unknown (batch-run.json is another job's)"),
        ),
        ("Pier version", _e(card.pier_version or "unknown (batch-run.json is another job's)")),
        ("trials", f"{card.n_planned - len(card.missing)} of {card.n_planned} recorded"),
        ("missing trials", _e(missing) if card.missing else "none"),
        ("spend", _e(" · ".join(_spend_cells(card.spend)[:2])) + f" ({card.spend.n_priced} priced)"),
    ]
    rows = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in items)
    incomplete = " — incomplete" if card.missing else ""
    return f'<h3>{_e(card.job_name)}{incomplete}</h3>\n<table class="card">{rows}</table>'


def style_hash(style: str = STYLE) -> str:
    """The CSP source that allows exactly the page's style element."""
    return "sha256-" + base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()


def content_security_policy() -> str:
    """Nothing but the page's own style: no script, image, font, frame, fetch, form or base."""
    return f"default-src 'none'; style-src '{style_hash()}'; base-uri 'none'; form-action 'none'"


def render(report: Report, generated_at: datetime) -> str:
    """The whole page."""
    jobs = ", ".join(_e(card.job_name) for card in report.cards)
    sections = [
        ("Flaky tasks", _flaky(report)),
        ("Mean reward and pass@k", _scores(report)),
        ("Reward per task", '<p class="note">Mean reward of the counted attempts (each attempt\'s reward in '
         "brackets); flaky tasks first.</p>" + _matrix(report)),
        ("Cost and tokens per solved task", _cost(report)),
        ("Duration per task", _durations(report)),
        ("Failures counted apart", _failures(report)),
        ("Run cards", "\n".join(_card(card) for card in report.cards)),
    ]  # fmt: skip
    body = "\n".join(f"<h2>{title}</h2>\n{content}" for title, content in sections)
    generated = _e(generated_at.isoformat(timespec="seconds"))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_e(content_security_policy())}">
<meta name="referrer" content="no-referrer">
<title>sciencebench report: {jobs}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>sciencebench report</h1>
<p class="note">Jobs: {jobs}. Generated {generated} from the jobs' files.</p>
{body}
</body>
</html>
"""
