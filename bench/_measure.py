"""What one benchmark row records, and the timing of a single-process loop.

A :class:`Result` keeps every raw sample; the figure shown is the median and the
spread is the min..max over the repeated runs. ``cost`` turns any figure into
"time per operation" so ratios read the same way for latencies and throughputs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .lock_bench import per_pair_us

Kind = Literal["orbitive", "alternative", "floor"]
Unit = Literal["us", "ops/s"]


@dataclass(frozen=True)
class Settings:
    """How long and how often each figure is measured."""

    seconds: float  # per uncontended run
    repeats: int  # runs per uncontended figure
    window: float  # seconds per contention round
    rounds: int  # contention rounds per figure
    wakes: int  # wakes per latency run
    wake_repeats: int  # latency runs per figure
    contention: tuple[str, ...] | None  # contenders in the contention runs (None: all)


class Skip(Exception):
    """A row cannot run here; the message says why (printed, and kept in the JSON)."""


@dataclass
class Result:
    """One row: a contender measured in one group (e.g. "4 processes, 1 key").

    ``samples`` are microseconds per operation (unit "us", lower is better) or
    operations per second (unit "ops/s", higher is better), one per repeated run.
    """

    section: str
    group: str
    name: str
    kind: Kind
    unit: Unit
    samples: list[float] = field(default_factory=list)
    skipped: str | None = None
    extra: dict[str, float] = field(default_factory=dict)
    #: (section, group) whose floor and alternatives this row is compared with
    #: when its own group has none (the pool rows); None: its own group.
    compare: tuple[str, str] | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def cost(self) -> float:
        """Seconds-like cost per operation: lower is better for every unit."""
        return self.median if self.unit == "us" else 1.0 / self.median

    def spread(self) -> tuple[float, float]:
        """(min, max) over the samples."""
        return min(self.samples), max(self.samples)


def calibrated_us(cycle: Callable[[int], bool], seconds: float, repeats: int) -> list[float]:
    """Microseconds per ``cycle(0)`` call, ``repeats`` runs of about ``seconds`` each.

    The pair count is sized from a short probe so that a 1 µs flock pair and a
    100 µs database round trip both run for about the same wall time.
    """
    pairs = 8
    while True:
        started = time.perf_counter()
        _loop(cycle, pairs)
        took = time.perf_counter() - started
        if took >= seconds / 20 or pairs >= 1 << 24:
            break
        pairs *= 4
    pairs = max(1, int(pairs * seconds / max(took, 1e-9)))
    return per_pair_us(lambda n: _loop(cycle, n), pairs, repeats)


def _loop(cycle: Callable[[int], bool], pairs: int) -> None:
    for _ in range(pairs):
        cycle(0)
