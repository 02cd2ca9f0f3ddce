"""What a run found and how it is shown: figures, the printed lines, results JSON, docs/performance.md.

Figure modules measure into a local `Findings` and return its frozen
`Outcome`; `Report` prints each outcome as it arrives and collects them for
`results()`, `write_json` and `write_doc`.

A timing figure measured more than once carries its samples: its value is
their median, `results["spread"]` keeps min, median, max and the samples.
Quick mode judges no goal: its figures are shown with their goals, marked
`not judged`, and nothing is MISSED (its sizes are too small to hold them to
the full run's goals).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bench.params import Params

DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


@dataclass(frozen=True)
class Figure:
    """One measured figure: its value, the goal it is held to (None: a raw figure) and whether it met it."""

    name: str
    value: float | None
    goal: str | None = None
    met: bool | None = None
    detail: str = ""
    samples: tuple[float, ...] = ()  # when measured more than once; `value` is their median

    def line(self) -> str:
        """The line the run prints for this figure."""
        shown = "n/a" if self.value is None else f"{self.value:.4g}"
        status = "" if self.goal is None else _status(self.met)
        goal = ("goal " + self.goal) if self.goal else ""
        spread = f" [{spread_text(self.samples)}]" if len(self.samples) > 1 else ""
        return f"  {self.name:<34} {shown:>10}   {goal:<16} {status:<11} {self.detail}{spread}"

    def spread(self) -> dict[str, Any] | None:
        """min, median, max and the samples, when there is more than one."""
        if len(self.samples) < 2:
            return None
        return {"min": min(self.samples), "median": statistics.median(self.samples), "max": max(self.samples),
                "n": len(self.samples), "samples": list(self.samples)}  # fmt: skip


def _status(met: bool | None) -> str:
    return "not judged" if met is None else ("met" if met else "MISSED")


def spread_text(samples: tuple[float, ...] | list[float]) -> str:
    """`min-max of n` of some samples, as the table and the printed lines show it."""
    return f"{min(samples):.4g}-{max(samples):.4g} of {len(samples)}"


@dataclass(frozen=True)
class Note:
    """Something the reader of the figures should know (printed and kept in the results)."""

    text: str


@dataclass(frozen=True)
class Outcome:
    """What one part of an item found: figures and notes in the order found, raw data, errors."""

    entries: tuple[Figure | Note, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def figures(self) -> tuple[Figure, ...]:
        """The figures, in the order they were measured."""
        return tuple(e for e in self.entries if isinstance(e, Figure))

    @property
    def notes(self) -> tuple[str, ...]:
        """The notes' texts, in order."""
        return tuple(e.text for e in self.entries if isinstance(e, Note))


class ItemCrash(Exception):
    """An item raised; `partial` is what it had found before (its cause is the real exception)."""

    def __init__(self, partial: Outcome) -> None:
        super().__init__("item crashed")
        self.partial = partial


class Findings:
    """A figure module's notebook while it measures; `outcome()` freezes it."""

    def __init__(self) -> None:
        self.entries: list[Figure | Note] = []
        self.raw: dict[str, Any] = {}
        self.errors: dict[str, str] = {}

    def figure(
        self,
        name: str,
        value: float | None,
        goal: str | None = None,
        met: bool | None = None,
        detail: str = "",
        samples: list[float] | None = None,
    ) -> None:
        """Add a figure (`goal` None: a raw figure or a baseline); `samples` when measured more than once."""
        self.entries.append(Figure(name, value, goal, met, detail, tuple(samples or ())))

    def note(self, text: str) -> None:
        """Add a note."""
        self.entries.append(Note(text))

    def outcome(self) -> Outcome:
        """The findings so far, frozen."""
        return Outcome(
            tuple(self.entries), MappingProxyType(dict(self.raw)), MappingProxyType(dict(self.errors))
        )

    @contextlib.contextmanager
    def kept_on_crash(self) -> Iterator[Findings]:
        """Re-raise any exception as `ItemCrash` carrying what was found before it."""
        try:
            yield self
        except ItemCrash:
            raise
        except Exception as exc:
            raise ItemCrash(self.outcome()) from exc


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def banner(title: str) -> None:
    """Print an item's heading with the current load average."""
    print(f"\n== {title}   (load average {' '.join(map(str, loadavg()))})", flush=True)


@dataclass
class Report:
    """Every outcome of one run, as results.json holds them."""

    params: Params
    figures: dict[str, float | None] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    goals: dict[str, dict[str, Any]] = field(default_factory=dict)
    spread: dict[str, dict[str, Any]] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def record(self, outcome: Outcome) -> None:
        """Print an outcome's figures and notes (in their order) and keep everything it holds.

        In quick mode no goal is judged (`met` None).
        """
        for entry in outcome.entries:
            if isinstance(entry, Note):
                self.notes.append(entry.text)
                print(f"  note: {entry.text}", flush=True)
                continue
            if self.params.quick:
                entry = replace(entry, met=None)
            self.figures[entry.name] = entry.value
            self.details[entry.name] = entry.detail
            if (spread := entry.spread()) is not None:
                self.spread[entry.name] = spread
            if entry.goal is not None:
                self.goals[entry.name] = {
                    "goal": entry.goal, "met": entry.met, "value": entry.value, "detail": entry.detail,
                }  # fmt: skip
            print(entry.line(), flush=True)
        self.raw.update(outcome.raw)
        self.errors.update(outcome.errors)

    def missed(self) -> list[str]:
        """Names of the figures that missed their goal (none in quick mode: nothing is judged)."""
        return [name for name, goal in self.goals.items() if goal["met"] is False]

    def results(
        self, duration: float, loads: dict[str, list[float]], phases: dict[str, float]
    ) -> dict[str, Any]:
        """The whole run as bench/results.json holds it."""
        quick = self.params.quick
        return {
            "mode": "quick" if quick else "full",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "duration_s": duration,
            "machine": machine(),
            "load_average": loads,
            "phase_s": phases,
            "figures": self.figures,
            "spread": self.spread,
            "details": self.details,
            "goals": self.goals,
            "raw": self.raw,
            "notes": self.notes,
            "errors": self.errors,
            "reproduce": ".venv/bin/python -m bench.run" + (" --quick" if quick else ""),
        }


def write_json(results: dict[str, Any], out: Path) -> None:
    """Write the results as indented JSON."""
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")


def machine() -> dict[str, Any]:
    """The machine and the versions that shape the figures."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    with contextlib.suppress(Exception):
        import celery
        import kombu
        import redis

        info.update(
            celery=celery.__version__, kombu=getattr(kombu, "__version__", "?"), redis_py=redis.__version__
        )
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["docker_engine"] = out.stdout.strip()
    with contextlib.suppress(Exception):
        out = subprocess.run(
            [os.environ.get("REDIS_SERVER_BIN", "redis-server"), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["redis_server"] = out.stdout.split()[2].removeprefix("v=")
    with contextlib.suppress(Exception):
        import importlib.metadata

        info["pier"] = importlib.metadata.version("datacurve-pier")
    return info


ORDER = [
    (
        "makespan_heavy_tail_cold",
        "1. scheduling, heavy tail, equal timeouts: makespan / bound, no history at all",
    ),
    ("makespan_heavy_tail_other_agent", "1. the same, a first run after another agent's run"),
    ("makespan_heavy_tail_history", "1. the same, a second run (ordered by its own measured durations)"),
    ("pier_makespan_heavy_tail", "1. baseline: Pier's own queue, same tasks in the same order, -n 4"),
    ("heavy_tail_cold_over_pier", "1. no history at all / Pier's queue, paired by seed"),
    ("makespan_over_lower_bound", "1. scheduling, timeouts proportional to durations: makespan / bound"),
    ("pier_makespan_over_lower_bound", "1. baseline: Pier's own queue, same tasks, -n 4"),
    ("overhead_ms_per_trial", "2. orchestration overhead per trial (ms)"),
    ("overhead_ratio", "2. overhead / bare Celery chord no-op task"),
    ("submit_10k_s", "3. `sciencebench submit`, 10,000 trials (s)"),
    ("submit_10k_ratio_to_bare_celery", "3. submit / bare 10,000-task chord dispatch"),
    ("submit_10k_rss_mb", "3. submit peak RSS (MB)"),
    ("submit_10k_tasks_ratio_to_bare_celery", "3. same, 10,000 tasks x 1 attempt (raw)"),
    ("finalize_10k_s", "3. finalize 10,000 trial records (s)"),
    ("pulls_per_image_per_host", "4. pulls per image per host, 8 trials, 2 images"),
    ("real_trial_ratio", "5. real trial: via worker / direct `pier run`"),
    ("scaling_1_to_2", "6. throughput 2 workers / 1 worker"),
    ("warm_start_harness_ratio", "7. Pier start: harness stage warm (zygote) / cold (exec)"),
    ("scaling_real_1_to_2", "8. real trials: throughput 2 worker containers / 1"),
    ("bake_s", "9. bake Codex into the demo's agent image (s)"),
    ("rebake_s", "9. the same bake again, a no-op (s)"),
    ("agent_setup_baked_s", "9. agent setup of a real Codex trial on the baked image (s)"),
    ("campaign_placed_makespan_over_bound", "10. campaign, 4 hosts, 2 jobs: makespan / bound, placed"),
    ("campaign_unplaced_makespan_over_bound", "10. the same, unplaced (every trial to the shared queue)"),
    ("campaign_placed_pulls", "10. images pulled, all hosts, placed (8 images)"),
    ("campaign_unplaced_pulls", "10. the same, unplaced"),
    ("campaign_placed_b_wait_s", "10. job B's wait for its first trial, placed (s)"),
    ("campaign_unplaced_b_wait_s", "10. the same, unplaced (s)"),
]


def schedule_table(results: dict[str, Any]) -> list[str]:
    """Item 1 as one table: makespan / bound of each contender on each workload (median, min-max of n)."""
    raw = results.get("raw", {}).get("schedule", {})
    columns = [
        ("cold", "sciencebench, no history"),
        ("other", "sciencebench, after another agent"),
        ("history", "sciencebench, own history"),
        ("pier", "Pier's own queue"),
    ]
    rows = []
    if isinstance(heavy := raw.get("heavy_tail"), dict) and isinstance(heavy.get("runs"), dict):
        seeds = heavy.get("seeds", {})
        rows.append((f"{heavy['label']}, {len(seeds)} seed(s)", heavy["runs"]))
    if isinstance(informative := raw.get("informative"), dict) and isinstance(informative.get("runs"), dict):
        rows.append((informative["label"], informative["runs"]))
    if not rows:
        return []
    lines = ["", "Scheduling (item 1), makespan / bound: median (min-max of n):", "",
             "| workload | " + " | ".join(title for _, title in columns) + " |",
             "|---|" + "---|" * len(columns)]  # fmt: skip
    for label, runs in rows:
        cells = []
        for kind, _ in columns:
            samples = [r["ratio"] for r in runs.get(kind, []) if "ratio" in r]
            cells.append(f"{statistics.median(samples):.3f} ({spread_text(samples)})" if samples else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def write_doc(results: dict[str, Any], doc: Path = DOC) -> None:
    """Replace the generated block of docs/performance.md (or create the file)."""
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    m = results["machine"]
    lines = [
        begin,
        "",
        f"Measured {results['date']} on {m.get('cpus')} CPU(s) "
        f"({m.get('cpu_model', '?')}), {m.get('mem_gb', '?')} GB RAM, Linux {m.get('kernel')}, "
        f"Python {m.get('python')}, Celery {m.get('celery')}, kombu {m.get('kombu')}, "
        f"redis-server {m.get('redis_server')}, Docker Engine {m.get('docker_engine')}, "
        f"Pier {m.get('pier')}. Run took {results['duration_s']:.0f} s; load average before each "
        "item is in `bench/results.json` (`load_average`). Reproduce: "
        f"`{results['reproduce']}` (see above).",
    ]
    for update in results.get("updates", []):
        names = ", ".join(f"`{name}`" for name in update["figures"])
        lines += ["", f"Measured again on {update['date']} ({update['duration_s']:.0f} s): {names} "
                  f"(`{update['reproduce']}`)."]  # fmt: skip
    lines += [
        "",
        "| figure | value | goal | status |",
        "|---|---|---|---|",
    ]
    spreads = results.get("spread", {})
    for name, label in ORDER:
        value = results["figures"].get(name)
        goal = results["goals"].get(name)
        shown = "n/a" if value is None else f"{value:.4g}"
        if name in spreads:
            shown += f" ({spread_text(spreads[name]['samples'])})"
        status = "" if goal is None else ("**MISSED**" if goal["met"] is False else _status(goal["met"]))
        target = goal["goal"] if goal else ("(baseline)" if name.startswith("pier_") else "(raw)")
        lines.append(f"| {label} (`{name}`) | {shown} | {target} | {status} |")
    lines += ["", "Values are medians; in brackets the smallest and largest sample and their number."]
    lines += schedule_table(results)
    lines += ["", "Details per figure (what was compared with what):", ""]
    for name, _ in ORDER:
        detail = results.get("details", {}).get(name)
        if detail:
            lines.append(f"- `{name}`: {detail}")
    if results.get("notes"):
        lines += ["", "Notes printed by the run:", ""] + [f"- {n}" for n in results["notes"]]
    if results.get("errors"):
        lines += ["", "Errors during the run:", ""] + [
            f"- `{k}`: {v[:300]}" for k, v in results["errors"].items()
        ]
    lines += ["", end]
    block = "\n".join(lines)
    text = doc.read_text() if doc.exists() else ""
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = (text.rstrip() + "\n\n" if text else "# Performance\n\n") + block + "\n"
    doc.write_text(text)
