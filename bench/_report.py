"""Output of a run: ratios, the terminal table, results.md, the JSON file and the PNG chart.

Ratios are costs: ``x floor`` is a row's time per operation over the flock
floor's in the same group (for throughputs, the floor's throughput over the
row's), so 1.0 is as fast as the floor and 2.0 twice as slow; ``x best alt`` is
the same against the fastest alternative of the group. rich and matplotlib are
optional: without rich the table is printed as Markdown, without matplotlib no
chart is drawn (the reason is printed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._measure import Result

Row = list[str]
HEADER = ["group", "contender", "median", "spread (min..max)", "x floor", "x best alt", "notes"]


def ratios(results: list[Result]) -> dict[int, tuple[float | None, float | None]]:
    """Per measured result (by index): its cost over the floor's and over the best alternative's."""
    out: dict[int, tuple[float | None, float | None]] = {}
    for index, result in enumerate(results):
        if not result.samples:
            continue
        where = result.compare or (result.section, result.group)
        peers = [r for r in results if (r.section, r.group) == where and r.samples]
        floor = next((r.cost for r in peers if r.kind == "floor"), None)
        alternatives = [r.cost for r in peers if r.kind == "alternative"]
        best = min(alternatives) if alternatives else None
        out[index] = (
            result.cost / floor if floor else None,
            result.cost / best if best else None,
        )
    return out


def _value(value: float, unit: str) -> str:
    if unit == "ops/s":
        return f"{value:,.0f}/s"
    return f"{value:,.2f} µs" if value < 100 else f"{value:,.0f} µs"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _notes(result: Result) -> str:
    extra = result.extra
    if "min_max_share" in extra:
        notes = f"min/max {extra['min_max_share']:.2f}, min/fair {extra['min_fair_share']:.2f}"
        if extra.get("busy_share", 0.0) > 0.0:
            notes += f", busy {extra['busy_share']:.0%}"
        if "handover_share" in extra:
            notes += f", handed over {extra['handover_share']:.0%}"
        if "over_filelock" in extra:
            notes += f", {extra['over_filelock']:.1f}x filelock"
        return notes
    if "over_pair" in extra:
        return f"{extra['over_pair']:.2f}x its engine's try_lock + release"
    if "p99_us" in extra:
        return f"p99 {_value(extra['p99_us'], 'us')}"
    if "admitted_share" in extra:
        return f"{extra['admitted_share']:.0%} of the timed hits admitted"
    return ""


def sections(results: list[Result]) -> list[str]:
    """The section names in first-seen order."""
    return list(dict.fromkeys(result.section for result in results))


def rows(results: list[Result], section: str) -> list[Row]:
    """The table rows of one section, skipped results included with their reason."""
    found = ratios(results)
    table = []
    for index, result in enumerate(results):
        if result.section != section:
            continue
        if not result.samples:
            table.append([result.group, result.name, "skipped", "", "", "", result.skipped or ""])
            continue
        low, high = result.spread()
        to_floor, to_best = found[index]
        table.append(
            [
                result.group,
                result.name,
                _value(result.median, result.unit),
                f"{_value(low, result.unit)} .. {_value(high, result.unit)}",
                _ratio(to_floor),
                _ratio(to_best),
                _notes(result),
            ]
        )
    return table


def markdown(results: list[Result]) -> str:
    """The tables as Markdown, one per section (the plain-text fallback and the docs' source)."""
    lines = []
    for section in sections(results):
        lines += [
            f"#### {section}",
            "",
            "| " + " | ".join(HEADER) + " |",
            "|" + "---|" * len(HEADER),
        ]
        for row in rows(results, section):
            lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
        lines.append("")
    return "\n".join(lines)


def print_table(results: list[Result]) -> None:
    """Print one table per section with rich when it is installed, else Markdown."""
    try:
        from rich.console import Console  # noqa: PLC0415 - optional dependency
        from rich.table import Table  # noqa: PLC0415
    except ImportError:
        print(markdown(results))
        return
    console = Console()
    console.width = max(console.width, 150)
    for section in sections(results):
        table = Table(title=section, title_justify="left")
        for name in HEADER:
            table.add_column(name, justify="right" if name[0] in "msx" else "left")
        for row in rows(results, section):
            table.add_row(*row)
        console.print(table)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            model = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), ""
            )
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": model or platform.processor(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }


def write_json(path: Path, results: list[Result], meta: dict[str, Any]) -> None:
    """Every raw sample, the medians and the ratios, with the machine and command."""
    found = ratios(results)
    entries = []
    for index, result in enumerate(results):
        entry = dataclasses.asdict(result)
        if result.samples:
            entry["median"] = result.median
            entry["x_floor"], entry["x_best_alternative"] = found[index]
        entries.append(entry)
    document = {
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        **meta,
        "results": entries,
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _series(results: Iterable[Result], keys: int) -> dict[str, list[tuple[int, Result]]]:
    series: dict[str, list[tuple[int, Result]]] = {}
    for result in results:
        if result.samples and result.extra.get("keys") == keys:
            series.setdefault(result.name, []).append((int(result.extra["processes"]), result))
    return series


def write_chart(path: Path, results: list[Result], title: str) -> str | None:
    """Throughput against process count (one key; 64 keys as hollow markers, 1 and 8 processes).

    Returns None, or the reason no chart was drawn.
    """
    try:
        import matplotlib  # noqa: PLC0415 - optional dependency

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError as exc:
        return f"matplotlib not importable ({exc})"
    contention = [result for result in results if result.section == "contention"]
    figure, axes = pyplot.subplots(figsize=(9.0, 4.5), dpi=90)
    for name, points in _series(contention, 1).items():
        xs = [procs for procs, _ in points]
        line = axes.plot(xs, [r.median for _, r in points], marker="o", label=name)[0]
        low = [r.median - r.spread()[0] for _, r in points]
        high = [r.spread()[1] - r.median for _, r in points]
        axes.errorbar(
            xs, [r.median for _, r in points], yerr=[low, high], fmt="none", ecolor=line.get_color()
        )
        for procs, result in _series(contention, 64).get(name, []):
            axes.plot(
                [procs], [result.median], marker="D", fillstyle="none", color=line.get_color()
            )
    axes.set_xscale("log", base=2)
    axes.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    axes.set_yscale("log")
    axes.set_xlabel("processes (hollow diamonds: 1 and 8 processes over 64 keys)")
    axes.set_ylabel("acquire + release pairs per second")
    axes.set_title(title, fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    return None
