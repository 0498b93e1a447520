"""The benchmark run: build the job list, run it with a progress display, write the outputs."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import _handover, _pool, _report, _wake
from ._contenders import CONTENDERS, HELPER_SUFFIX, Contender
from ._contention import record, run_round
from ._measure import Result, Settings, Skip, calibrated_us
from ._workspace import Workspace

Job = Callable[[Workspace], list[Result]]


FULL = Settings(0.3, 7, 1.0, 3, 400, 5, None)
QUICK = Settings(0.03, 3, 0.15, 1, 60, 2, ("orbitive LockTable.wait_acquire", "fcntl.flock pair"))
#: (processes, keys) of the contention runs.
CONTENTION = ((1, 1), (2, 1), (4, 1), (8, 1), (1, 64), (8, 64))


def uncontended(contender: Contender, settings: Settings) -> Job:
    """One process, one key: microseconds per acquire + release."""

    def job(ws: Workspace) -> list[Result]:
        result = Result(
            "acquire + release", "1 process, 1 key", contender.name, contender.kind, "us"
        )
        with _skipping(result):
            prepared = contender.prepare(ws, 1)
            try:
                session = prepared.open()
                try:
                    result.samples = calibrated_us(
                        session.cycle, settings.seconds, settings.repeats
                    )
                finally:
                    session.close()
            finally:
                prepared.cleanup()
        return [result]

    return job


def contention(contender: Contender, procs: int, keys: int, settings: Settings) -> Job:
    """``procs`` processes over ``keys`` keys: pairs per second and fairness."""
    group = f"{procs} process{'es' if procs > 1 else ''}, {keys} key{'s' if keys > 1 else ''}"

    def job(ws: Workspace) -> list[Result]:
        result = Result("contention", group, contender.name, contender.kind, "ops/s")
        with _skipping(result):
            prepared = contender.prepare(ws, keys)
            try:
                rounds = [
                    run_round(prepared, procs, keys, settings.window)
                    for _ in range(settings.rounds)
                ]
            finally:
                prepared.cleanup()
            record(result, rounds, procs, keys)
        return [result]

    return job


@contextlib.contextmanager
def _skipping(result: Result) -> Iterator[None]:
    try:
        yield
    except Skip as exc:
        result.skipped = str(exc)
        result.samples = []


def jobs(settings: Settings, only: list[str]) -> list[tuple[str, Job]]:
    """Every measurement of the run, labelled for the progress display."""
    chosen = [c for c in CONTENDERS if not only or any(part in c.name for part in only)]
    found: list[tuple[str, Job]] = [(c.name, uncontended(c, settings)) for c in chosen]
    for contender in chosen:
        if not contender.processes:
            continue
        if settings.contention is not None and contender.name not in settings.contention:
            continue
        for procs, keys in CONTENTION:
            label = f"{contender.name}: {procs} procs x {keys} keys"
            found.append((label, contention(contender, procs, keys, settings)))
    found.append(
        ("wake latency", lambda ws: _wake.wake_results(settings.wakes, settings.wake_repeats))
    )
    found.append(("hand-over", lambda ws: _handover.handover_results(ws, settings)))
    found.append(("pool", lambda ws: _pool.pool_results(ws, settings)))
    return found


def run_all(work: list[tuple[str, Job]], ws: Workspace) -> list[Result]:
    """Run every job under a rich progress bar (one line per job on stderr without rich)."""
    try:
        from rich.progress import Progress  # noqa: PLC0415 - optional dependency
    except ImportError:
        return _run_plain(work, ws)
    results: list[Result] = []
    with Progress(transient=True) as bar:
        task = bar.add_task("benchmarks", total=len(work))
        for label, job in work:
            bar.update(task, description=label)
            results += _said(job(ws), bar.console.print)
            bar.advance(task)
    return results


def _run_plain(work: list[tuple[str, Job]], ws: Workspace) -> list[Result]:
    results: list[Result] = []
    for number, (label, job) in enumerate(work, 1):
        print(f"[{number}/{len(work)}] {label}", file=sys.stderr, flush=True)
        results += _said(job(ws), print)
    return results


def _said(results: list[Result], say: Callable[[str], None]) -> list[Result]:
    """Print each skip reason as soon as it is known."""
    for result in results:
        if result.skipped:
            say(f"skipped {result.name} ({result.group}): {result.skipped}")
    return results


def _over_pairs(results: list[Result]) -> None:
    """Note each ``with store.lock()`` row's cost over its engine's pair row (issue 25: at
    most 2x on shm://, 1.2x on the others)."""
    pairs = {(r.section, r.group, r.name): r for r in results if r.samples}
    for result in results:
        if result.samples and result.name.endswith(HELPER_SUFFIX):
            pair = pairs.get((result.section, result.group, result.name[: -len(HELPER_SUFFIX)]))
            if pair is not None:
                result.extra["over_pair"] = result.cost / pair.cost


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="orbitive side by side with the locks users would pick instead.",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run, under a minute")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory")
    parser.add_argument(
        "--only", action="append", default=[], metavar="TEXT", help="contenders whose name has TEXT"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[Result]:
    """Run the benchmarks; print the table; write results.json, results.md, contention.png."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    settings = QUICK if args.quick else FULL
    work = jobs(settings, args.only)
    started, load_before = time.monotonic(), os.getloadavg()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so `kill` stops the servers too
    ws = Workspace()
    try:
        results = run_all(work, ws)
    finally:
        ws.close()
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench", *argv])
    meta: dict[str, Any] = {"command": command, "mode": "quick" if args.quick else "full"}
    meta["seconds"] = round(time.monotonic() - started, 1)
    meta["load_average_before"], meta["load_average_after"] = load_before, os.getloadavg()
    _over_pairs(results)
    _report.print_table(results)
    _report.write_json(args.out / "results.json", results, meta)
    (args.out / "results.md").write_text(_report.markdown(results), encoding="utf-8")
    title = f"contention, {_report.machine()['cpus']} CPUs ({meta['mode']} mode)"
    missing = _report.write_chart(args.out / "contention.png", results, title)
    print(
        f"wrote {args.out}/results.json, results.md"
        + (f"; no chart: {missing}" if missing else ", contention.png")
    )
    return results
