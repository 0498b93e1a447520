"""Borrower processes reserving one resource at once never over-admit it."""

from __future__ import annotations

from pathlib import Path

from orbitive.pool import Candidate, Key, Pool

from ._admission import borrower, owner
from ._agent import Context
from ._sampler import Sampler, settled
from .conftest import CAPACITY

KEY = Key.digest(b"tcp://127.0.0.1:6379")
UNITS = 3
BORROWERS = 6
ATTEMPTS = 200


class LoadSampler(Sampler):
    """Samples ``pool.candidates(KEY)``: reserved + active of every resource."""

    def __init__(self, pool: Pool) -> None:
        self.highest = 0
        self.breaches: list[Candidate] = []
        self.shapes: set[int] = set()  # how many candidates each sample held
        super().__init__(pool, 0.0002)

    def sample(self) -> None:
        candidates = self.pool.candidates(KEY)
        self.shapes.add(len(candidates))
        for candidate in candidates:
            load = candidate.reserved + candidate.active
            self.highest = max(self.highest, load)
            if load > candidate.capacity:
                self.breaches.append(candidate)


def test_six_borrower_processes_never_over_admit_a_resource_of_three_units(
    shm_pool: Pool, fleet_name: str, context: Context, tmp_path: Path
) -> None:
    start, finish = context.Event(), context.Event()
    out, owner_out = context.Queue(), context.Queue()
    owner_process = context.Process(
        target=owner,
        args=(fleet_name, CAPACITY, KEY.value, UNITS, str(tmp_path), finish, owner_out),
        daemon=True,
    )
    processes = [owner_process]
    sampler: LoadSampler | None = None
    try:
        owner_process.start()
        kind, rid = owner_out.get(timeout=120.0)
        assert kind == "ready"
        processes += [
            context.Process(
                target=borrower,
                args=(fleet_name, CAPACITY, KEY.value, rid, ATTEMPTS, str(tmp_path), start, out),
                daemon=True,
            )
            for _ in range(BORROWERS)
        ]
        for process in processes[1:]:
            process.start()
        joined = [out.get(timeout=120.0) for _ in range(BORROWERS)]
        assert [kind for kind, _ in joined] == ["joined"] * BORROWERS
        sampler = LoadSampler(shm_pool)
        start.set()  # every borrower is mapped and waiting: go
        results = [out.get(timeout=120.0) for _ in range(BORROWERS)]
        sampler.stop()
        [candidate] = settled(shm_pool, KEY)
        assert (candidate.reserved, candidate.active) == (0, 0)  # every unit came back
        probe = shm_pool.reserve(rid)
        shm_pool.cancel_reservation(probe)
        finish.set()
        kind, served = owner_out.get(timeout=120.0)
        assert kind == "served"

        assert sampler.samples > 0
        assert sampler.breaches == []  # reserved + active <= capacity in every sample
        assert sampler.highest == UNITS  # the samples saw it full: the bound was tested
        assert sampler.shapes == {1}
        reserved = sum(r[1] for r in results)
        busy = sum(r[2] for r in results)
        assert [r[0] for r in results] == ["done"] * BORROWERS
        assert [r[1] + r[2] for r in results] == [ATTEMPTS] * BORROWERS  # reserved or Busy
        assert busy > 0 and reserved >= ATTEMPTS
        assert [r[3] for r in results] == [0] * BORROWERS  # every lease was served
        assert served == reserved  # the owner accepted each lease once, none twice
        assert probe.fence == reserved + 1  # a fence per reservation; Busy tries took none
    finally:
        if sampler is not None:
            sampler.stop()
        finish.set()
        for process in processes:
            process.join(30.0)
            if process.is_alive():
                process.kill()
                process.join(10.0)
    assert [process.exitcode for process in processes] == [0] * (BORROWERS + 1)
    assert shm_pool.candidates(KEY) == []  # the owner unregistered on its way out
