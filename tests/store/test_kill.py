"""Store clients killed with SIGKILL, on every engine: while holding, and in mid-churn."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import MutableSequence
from multiprocessing.sharedctypes import SynchronizedArray
from typing import cast

import pytest

from orbitive.store import open_store

from .._processes import Channel, Processes
from ._workers import CTX, PATIENCE_S

CHURN_TTL_S = 0.3
CHURN_NAMES = 2
CHURNERS = 4


def hold_until_killed(channel: Channel, url: str, ttl: float) -> None:
    """Take ``held`` for ``ttl`` seconds, report its token, then wait to be killed."""
    store = open_store(url)
    lock = store.try_lock("held", "victim", ttl)
    channel.send(None if lock is None else lock.fencing_token)
    time.sleep(PATIENCE_S)


def churn_until_killed(
    channel: Channel, url: str, index: int, highest: SynchronizedArray[int]
) -> None:
    """try_lock / renew / release as fast as possible, recording the highest token seen in
    this churner's own row of ``highest`` (without the array's lock: a churner killed
    holding it would block every reader; measured, 1 of 10 soak rounds hung there)."""
    rng = random.Random(index)
    tokens = cast("MutableSequence[int]", highest.get_obj())  # ctypes reads ints
    with open_store(url) as store:
        channel.send("ready")
        while True:
            slot = rng.randrange(CHURN_NAMES)
            lock = store.try_lock(f"churn-{slot}", f"c{index}", CHURN_TTL_S)
            if lock is None:
                continue
            at = index * CHURN_NAMES + slot
            tokens[at] = lock.fencing_token  # a name's tokens only grow
            if rng.random() < 0.5:
                lock.renew(CHURN_TTL_S)
            if rng.random() < 0.7:
                lock.release()


def test_a_killed_holder_keeps_the_lock_until_its_ttl_then_a_larger_token_wins(
    store_url: str,
) -> None:
    with Processes("fork") as procs, open_store(store_url) as store:
        victim = procs.start(hold_until_killed, store_url, 1.0)
        token = victim.recv(PATIENCE_S)
        assert isinstance(token, int)
        assert victim.kill() == -signal.SIGKILL
        assert store.try_lock("held", "survivor", 30.0) is None  # the lease outlives its process
        info = store.inspect("held")
        assert info is not None and (info.owner, info.fencing_token) == ("victim", token)
        time.sleep(info.remaining_s + 0.05)
        lock = store.try_lock("held", "survivor", 30.0)
        assert lock is not None and lock.fencing_token > token
        assert lock.release()


@pytest.mark.slow
def test_clients_killed_in_mid_churn_leave_every_name_usable_with_larger_tokens(
    store_url: str,
) -> None:
    open_store(store_url).close()  # create the schema/file once, outside the race
    highest = CTX.Array("q", CHURNERS * CHURN_NAMES)  # a row per churner
    rng = random.Random(7)
    with Processes("fork") as procs:
        for _ in range(3):  # rounds: the store must survive kills again and again
            churners = [
                procs.start(churn_until_killed, store_url, i, highest) for i in range(CHURNERS)
            ]
            assert [churner.recv(PATIENCE_S) for churner in churners] == ["ready"] * CHURNERS
            time.sleep(rng.uniform(0.2, 0.5))
            assert [churner.kill() for churner in churners] == [-signal.SIGKILL] * CHURNERS
    with open_store(store_url) as store:
        time.sleep(CHURN_TTL_S + 0.1)  # every lease a dead churner held has lapsed
        assert store.locks() == []
        for slot in range(CHURN_NAMES):
            lock = store.try_lock(f"churn-{slot}", "survivor", 30.0)
            assert lock is not None, f"churn-{slot} is still held after every holder died"
            seen = max(cast("MutableSequence[int]", highest.get_obj())[slot::CHURN_NAMES])
            assert lock.fencing_token > seen > 0
            assert lock.release()
