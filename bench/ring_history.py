"""What a lock table's transition ring buys: the transitions a watcher loses, by ring size.

Run: ``.venv/bin/python bench/ring_history.py [--seconds S]``. For each ring size
(``LockLayout.ring_capacity``, frames per node) and each rate, one writer process
makes acquire + release pairs of one key (two transitions each) at that rate, or
as fast as it can, while a watcher in this process waits on the table's readiness
descriptor, drains it and polls, as ``orbit watch`` does. It prints the
transitions the writer published, those the watcher read, and those it lost
(``overwritten``: the writer lapped the watcher's cursor), and the most frames a
poll found waiting in the lane: how far behind the watcher fell.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import selectors
import time
from multiprocessing.connection import Connection

from orbitive import Fleet
from orbitive.lock import LockKey, LockLayout, LockOwner, LockTable

RINGS = (8, 16, 32, 64, 1024)
#: Rings and rates may be narrowed: ``--rings 32 64``, ``--rates 1000``.
#: Transitions per second of the writer (two per pair); 0: as fast as it can.
RATES = (1_000, 10_000, 100_000, 0)
LANES = 64


def _writer(fleet_name: str, ring: int, rate: int, seconds: float, done: Connection) -> None:
    with Fleet.join(fleet_name, LANES) as fleet:
        table = LockTable(fleet, LockLayout(ring_capacity=ring))
        key, owner = LockKey("bench", "ring"), LockOwner.random()
        pairs, started = 0, time.monotonic()
        end = started + seconds
        while (now := time.monotonic()) < end:
            if rate and pairs * 2 > (now - started) * rate:
                continue  # paced: wait for the next pair's time
            lease = table.try_acquire(key, owner, 30.0).lease
            table.release(lease)
            pairs += 1
        table.close()
        done.send(2 * pairs)


def _measure(ring: int, rate: int, seconds: float) -> tuple[int, int, int, int]:
    name = f"ring-bench-{os.getpid()}-{ring}-{rate}"
    with Fleet.join(name, LANES) as fleet:
        table = LockTable(fleet, LockLayout(ring_capacity=ring))
        ours, theirs = multiprocessing.Pipe()
        writer = multiprocessing.get_context("spawn").Process(
            target=_writer, args=(name, ring, rate, seconds, theirs)
        )
        read = lost = most = 0
        with selectors.DefaultSelector() as selector:
            selector.register(table.fileno(), selectors.EVENT_READ)
            writer.start()
            while not ours.poll():
                if not writer.is_alive() and not ours.poll():
                    raise SystemExit(f"the writer exited with {writer.exitcode}")
                selector.select(0.05)
                table.drain()
                found = table.poll()
                read += len(found.events)
                lost += found.overwritten + found.unavailable
                most = max(most, len(found.events) + found.overwritten)
            published: int = ours.recv()
            writer.join()
            found = table.poll()
            read += len(found.events)
            lost += found.overwritten + found.unavailable
        table.unlink()
        table.close()
    return published, read, lost, most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rings", type=int, nargs="+", default=RINGS)
    parser.add_argument("--rates", type=int, nargs="+", default=RATES)
    args = parser.parse_args()
    print("ring  rate/s    published       read       lost  lost %  most behind")
    for ring in args.rings:
        for rate in args.rates:
            published, read, lost, most = _measure(ring, rate, args.seconds)
            shown = f"{rate:,}" if rate else "max"
            share = 100 * lost / max(published, 1)
            print(
                f"{ring:>4}  {shown:>7}  {published:>10,} {read:>10,} {lost:>10,}"
                f"  {share:5.1f}  {most:>11,}",
                flush=True,
            )


if __name__ == "__main__":
    main()
