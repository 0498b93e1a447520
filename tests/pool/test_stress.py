"""Eight worker processes share resources under max_live while one is killed mid-lease."""

from __future__ import annotations

from pathlib import Path

from orbitive.pool import Key, Pool

from ._agent import Context
from ._sampler import Sampler, settled
from ._stress import stress_worker
from .conftest import CAPACITY

KEY = Key.digest(b"tcp://127.0.0.1:5432")
WORKERS = 8
MAX_LIVE = 12
CYCLES = 200


class LiveSampler(Sampler):
    """Samples the key's budget: the highest live count seen."""

    def __init__(self, pool: Pool) -> None:
        self.max_live = 0
        super().__init__(pool, 0.0005)

    def sample(self) -> None:
        live, _ = self.pool.budget(KEY)
        self.max_live = max(self.max_live, live)


def test_eight_workers_max_live_twelve_one_killed_mid_lease_nothing_lost(
    shm_pool: Pool, fleet_name: str, context: Context, tmp_path: Path
) -> None:
    start, holding, finish = context.Event(), context.Event(), context.Event()
    out = context.Queue()
    workers = [
        context.Process(
            target=stress_worker,
            args=(
                fleet_name,
                CAPACITY,
                KEY.value,
                MAX_LIVE,
                CYCLES,
                str(tmp_path),
                index == 0,
                start,
                holding,
                finish,
                out,
            ),
            daemon=True,
        )
        for index in range(WORKERS)
    ]
    sampler = LiveSampler(shm_pool)
    try:
        for worker in workers:
            worker.start()
        readies = [out.get(timeout=120.0) for _ in range(WORKERS)]
        assert [kind for kind, _ in readies] == ["ready"] * WORKERS
        start.set()  # all joined and serving: go
        assert holding.wait(120.0), "the victim never got a unit"
        victim = workers[0]
        victim.kill()
        victim.join(10.0)
        reported = shm_pool.reap_dead()
        assert len(reported) == 1
        victim_node = reported[0][0]
        results = [out.get(timeout=120.0) for _ in range(WORKERS - 1)]
        sampler.stop()
        assert [(kind, done) for kind, done, _ in results] == [("done", CYCLES)] * (WORKERS - 1)
        plans: dict[str, int] = {}
        for *_, counts in results:
            for name, count in counts.items():
                plans[name] = plans.get(name, 0) + count
        assert plans.get("RemoteReuse", 0) > 0 and plans.get("LocalReuse", 0) > 0, plans
        assert plans.get("Create", 0) > MAX_LIVE, plans  # retired resources were replaced
        assert sampler.samples > 0
        assert sampler.max_live <= MAX_LIVE  # live + creating may overlap by a registering claim
        candidates = settled(shm_pool, KEY)
        assert candidates, "the survivors' resources are still registered"
        for candidate in candidates:
            assert candidate.owner_node != victim_node
            assert (candidate.reserved, candidate.active) == (0, 0), candidate
        assert shm_pool.budget(KEY) == (len(candidates), 0)
    finally:
        sampler.stop()
        finish.set()
        for worker in workers:
            worker.join(30.0)
            if worker.is_alive():
                worker.kill()
                worker.join(10.0)
