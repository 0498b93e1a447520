"""Store locks are not re-entrant: a thread (or asyncio task) asking the blocking helper
for a name it holds through the same store is refused at once, never left waiting for
itself; a holder in another thread or task is waited for, and named in a timeout.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from orbitive.store import ErrorKind, LockNotReentrant, LockTimeout, Store, StoreError

BOUND = 2.0  # seconds: a refusal comes at once; a wait would last until the timeout


def test_the_same_thread_asking_again_is_refused_at_once(store: Store) -> None:
    with store.lock("nested", ttl=30.0) as outer:
        before = store.statistics()
        for timeout in (None, 60.0):
            start = time.monotonic()
            with pytest.raises(LockNotReentrant) as caught:
                store.lock("nested", ttl=30.0, timeout=timeout)
            assert time.monotonic() - start < BOUND
            error = caught.value
            assert isinstance(error, StoreError) and isinstance(error, RuntimeError)
            assert error.kind is ErrorKind.INVALID_INPUT
            assert error.key == "nested"
            assert "this very thread" in str(error) and repr(outer.owner) in str(error)
        after = store.statistics()
        assert (after.acquired_count, after.busy_count) == (
            before.acquired_count,
            before.busy_count,
        )
        assert not outer.lost
    with store.lock("nested", timeout=0) as again:  # released: free to take again
        assert again.fencing_token > outer.fencing_token


def test_a_released_lost_or_dropped_holder_is_no_reason_to_refuse(store: Store) -> None:
    lapsed = store.lock("gone", ttl=0.2, auto_renew=False)
    time.sleep(0.3)
    assert lapsed.lost
    with store.lock("gone", timeout=5.0) as lock:
        assert lock.fencing_token > lapsed.fencing_token


def test_a_semaphore_of_the_same_name_is_no_reason_to_refuse(store: Store) -> None:
    """A semaphore is a namespace of its own: holding one of its slots is not holding
    the lock of that name, nor does a lock held make a semaphore wait refuse."""
    semaphore = store.semaphore("both", limit=2)
    with (
        semaphore.acquire(ttl=30.0, timeout=0) as slot,
        store.lock("both", ttl=30.0, timeout=5.0) as lock,
        semaphore.acquire(ttl=30.0, timeout=5.0) as other,
    ):
        assert not slot.lost and not lock.lost
        assert other.slot != slot.slot


def test_another_thread_of_the_process_is_waited_for_and_named_in_a_timeout(
    store: Store,
) -> None:
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with store.lock("shared", ttl=30.0):
            held.set()
            done.wait(30.0)

    holder = threading.Thread(target=hold, name="the-holder")
    holder.start()
    try:
        assert held.wait(30.0)
        with pytest.raises(LockTimeout) as caught:
            store.lock("shared", timeout=0.2)
        message = str(caught.value)
        assert "in this very process" in message and "'the-holder'" in message
        threading.Timer(0.2, done.set).start()
        with store.lock("shared", timeout=10.0) as lock:  # waits for the other thread
            assert not lock.lost
    finally:
        done.set()
        holder.join(30.0)


def test_another_store_of_the_same_url_is_another_client(store: Store, other: Store) -> None:
    with other.lock("client", ttl=30.0), pytest.raises(LockTimeout):
        store.lock("client", timeout=0.2)  # a wait, not a refusal: anyone may release it


def test_the_same_task_asking_again_is_refused_and_another_task_waits(store: Store) -> None:
    async def main() -> tuple[float, bool]:
        async with store.lock_async("task", ttl=30.0):
            start = time.monotonic()
            with pytest.raises(LockNotReentrant, match="this very asyncio task"):
                await store.lock_async("task", ttl=30.0)
            refused_in = time.monotonic() - start

            async def other_task() -> bool:
                async with store.lock_async("task", timeout=10.0) as lock:
                    return not lock.lost

            waiting = asyncio.create_task(other_task())
            await asyncio.sleep(0.1)
            assert not waiting.done()
        return refused_in, await waiting

    refused_in, other_got_it = asyncio.run(main())
    assert refused_in < BOUND
    assert other_got_it
