"""orbitive.celery.Singleton in a real (eager) Celery app over a real SQLite store: keys,
modes, the fencing token, releases, cool-down and an unreachable store. The worker's
side in real prefork processes is ``test_worker.py``."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from orbitive.celery import DuplicateTask, InvalidSingletonOptions, Singleton
from orbitive.store import ErrorKind, LockTimeout, StoreError, open_store

from .conftest import MakeApp

#: What the bodies below saw, in order: (argument, fencing token).
Seen = list[tuple[Any, int | None]]


def _task(app: Celery, seen: Seen, **options: Any) -> Singleton:
    @app.task(base=Singleton, bind=True, name="unit.work", **options)
    def work(self: Singleton, a: int, b: int = 2, *, c: str = "x") -> int:
        seen.append((a, self.lock_token))
        return a + b

    return work  # type: ignore[no-any-return]


def test_positional_and_keyword_arguments_bound_to_the_signature_make_one_key(
    make_app: MakeApp,
) -> None:
    work = _task(make_app(), [])
    name = work.lock_name((1,), {})
    assert name.startswith("celery/unit.work/")
    assert work.lock_name((1, 2), {}) == name  # a default counts as passed
    assert work.lock_name((), {"a": 1, "b": 2, "c": "x"}) == name
    assert work.lock_name((1,), {"c": "x"}) == name
    assert work.lock_name((1, 3), {}) != name
    assert work.lock_name((1,), {"c": "y"}) != name


def test_unique_on_makes_the_key_of_the_named_arguments_only(make_app: MakeApp) -> None:
    app = make_app()
    by_a = _task(app, [], unique_on=["a"])
    assert by_a.lock_name((1, 5), {"c": "z"}) == by_a.lock_name((), {"a": 1})
    assert by_a.lock_name((1,), {}) != by_a.lock_name((2,), {})
    by_c = _task(make_app(), [], unique_on=["c"])
    assert by_c.lock_name((1,), {"c": "q"}) == by_c.lock_name((9, 9), {"c": "q"})
    assert by_c.lock_name((1,), {"c": "q"}) != by_c.lock_name((1,), {})
    nothing = _task(make_app(), [], unique_on=[])
    assert nothing.lock_name((1,), {}) == nothing.lock_name((7,), {"c": "w"})


def test_unique_on_naming_an_argument_the_task_does_not_take_is_refused(
    make_app: MakeApp,
) -> None:
    work = _task(make_app(), [], unique_on=["a", "nope"])
    with pytest.raises(InvalidSingletonOptions, match="nope"):
        work.lock_name((1,), {})
    with pytest.raises(InvalidSingletonOptions):
        work.delay(1)
    with pytest.raises(TypeError):
        _task(make_app(), []).lock_name((), {"zz": 1})


@pytest.mark.parametrize("options", [{"lock_mode": "never"}, {"ttl": 0}, {"on_store_error": "x"}])
def test_bad_options_are_refused_at_the_call(make_app: MakeApp, options: dict[str, Any]) -> None:
    work = _task(make_app(), [], **options)
    with pytest.raises(InvalidSingletonOptions):
        work.delay(1)


def test_the_body_runs_under_the_run_lock_and_reads_its_fencing_token(
    make_app: MakeApp, store_url: str
) -> None:
    seen: Seen = []
    work = _task(make_app(), seen)
    assert work.delay(1).get() == 3
    assert work.delay(1).get() == 3
    assert [a for a, _ in seen] == [1, 1]
    first, second = (token for _, token in seen)
    assert first is not None and second is not None and second > first
    with open_store(store_url) as store:
        assert store.locks() == []  # the run lock and the queue marker are gone


def test_a_call_while_the_key_runs_returns_the_running_tasks_result(
    make_app: MakeApp, store_url: str
) -> None:
    seen: Seen = []
    work = _task(make_app(), seen)
    with open_store(store_url) as store:
        running = store.try_lock(work.lock_name((1,), {}), "task-1 host:1:ab", 30.0)
        assert running is not None
        result = work.apply_async((1,), task_id="task-2")
        assert result.id == "task-1"
        assert work.delay(2).get() == 4  # another key runs
        running.release()
        assert work.delay(1).get() == 3
    assert [a for a, _ in seen] == [2, 1]


def test_a_call_while_the_key_is_queued_returns_the_queued_tasks_result(
    make_app: MakeApp, store_url: str
) -> None:
    seen: Seen = []
    work = _task(make_app(), seen)
    with open_store(store_url) as store:
        queued = store.try_lock(work.lock_name((1,), {}) + "/queued", "task-9", 30.0)
        assert queued is not None
        assert work.apply_async((1,)).id == "task-9"
        assert work.apply_async((), {"a": 1, "b": 2}).id == "task-9"
        queued.release()
    assert seen == []


def test_a_call_while_the_key_runs_returns_the_running_task_whatever_the_marker_names(
    make_app: MakeApp, store_url: str
) -> None:
    """The marker can name a task that will not run before the holder ends (a caller
    that took it as the holder started): the call is handed the running task."""
    seen: Seen = []
    work = _task(make_app(), seen)
    name = work.lock_name((1,), {})
    with (
        open_store(store_url) as store,
        store.lock(name, "task-1 host:1:ab", 30.0),
        store.lock(f"{name}/queued", "task-2", 30.0),
    ):
        assert work.apply_async((1,), task_id="task-3").id == "task-1"
    assert seen == []


def test_a_queued_call_that_finds_another_run_at_start_waits_for_it_then_runs(
    make_app: MakeApp, store_url: str
) -> None:
    seen: Seen = []
    work = _task(make_app(), seen)
    with open_store(store_url) as store:
        running = store.try_lock(work.lock_name((1,), {}), "task-1 host:1:ab", 0.5)
        assert running is not None  # not renewed: it lapses after 0.5 s
        assert work.apply((1,), task_id="task-2").get() == 3  # the worker's side
        assert running.lost
    (only,) = seen
    assert only[1] is not None and only[1] > running.fencing_token
    impatient = _task(make_app(), seen, wait_timeout=0.2)
    with (
        open_store(store_url) as store,
        store.lock(impatient.lock_name((1,), {}), "task-1 host:1:ab", 30.0),
        pytest.raises(LockTimeout),
    ):
        impatient.apply((1,), task_id="task-3", throw=True)


def test_a_call_whose_message_cannot_be_sent_stores_that_failure_as_its_result(
    store_url: str,
) -> None:
    """A duplicate handed its id meanwhile (the marker's owner) sees the failure."""
    app = Celery(
        "unsent", broker="redis://127.0.0.1:1/0", backend="cache+memory://", set_as_current=False
    )  # nothing listens on port 1
    app.conf.update(
        orbitive_store_url=store_url,
        task_publish_retry=False,
        broker_transport_options={"max_retries": 0},  # refused at once, not after 6 s
    )
    work = _task(app, [])
    with pytest.raises(Exception) as raised:
        work.apply_async((1,), task_id="task-1")
    result = work.AsyncResult("task-1")
    assert result.state == "FAILURE"
    assert type(result.result) is type(raised.value)
    with open_store(store_url) as store:
        assert store.locks() == []  # the marker is given back


def test_raise_on_duplicate_raises_duplicate_task_naming_the_holder(
    make_app: MakeApp, store_url: str
) -> None:
    work = _task(make_app(), [], raise_on_duplicate=True)
    name = work.lock_name((1,), {})
    with (
        open_store(store_url) as store,
        store.lock(name, "task-1 host:1:ab", 30.0),
        pytest.raises(DuplicateTask) as raised,
    ):
        work.delay(1)
    assert (raised.value.task_id, raised.value.lock_name) == ("task-1", name)


def test_skip_mode_returns_none_without_running_while_the_key_is_held(
    make_app: MakeApp, store_url: str
) -> None:
    seen: Seen = []
    work = _task(make_app(), seen, lock_mode="skip")
    with open_store(store_url) as store, store.lock(work.lock_name((1,), {}), "t host:1:a"):
        assert work.delay(1).get() is None
    assert seen == []
    assert work.delay(1).get() == 3


def test_wait_mode_waits_and_then_raises_lock_timeout(make_app: MakeApp, store_url: str) -> None:
    seen: Seen = []
    work = _task(make_app(), seen, lock_mode="wait", wait_timeout=0.2)
    with (
        open_store(store_url) as store,
        store.lock(work.lock_name((1,), {}), "t host:1:a"),
        pytest.raises(LockTimeout),
    ):
        work.delay(1)
    assert seen == []
    assert work.delay(1).get() == 3


def test_a_failing_body_releases_the_lock(make_app: MakeApp, store_url: str) -> None:
    app = make_app()

    @app.task(base=Singleton, name="unit.fail")
    def fail(a: int) -> None:
        raise ValueError(a)

    with pytest.raises(ValueError):
        fail.delay(1)
    with open_store(store_url) as store:
        assert store.locks() == []


def test_a_cooldown_keeps_the_key_after_a_success(make_app: MakeApp, store_url: str) -> None:
    seen: Seen = []
    work = _task(make_app(), seen, cooldown=30.0)
    first = work.delay(1)
    assert first.get() == 3
    assert work.delay(1).id == first.id  # refused: the finished task's result
    with open_store(store_url) as store:
        (cooling,) = store.locks()
        assert cooling.name.endswith("/cooldown") and cooling.owner == first.id
        skip = _task(make_app(), seen, lock_mode="skip", cooldown=30.0)
        assert skip.delay(1).get() is None  # skipped at start
        store.force_release(cooling.name)
    assert work.delay(1).get() == 3
    assert len(seen) == 2


def test_a_plain_function_call_runs_the_body_without_a_lock(make_app: MakeApp) -> None:
    seen: Seen = []
    work = _task(make_app(), seen)
    assert work(5) == 7
    assert seen == [(5, None)]


def test_an_unreachable_store_fails_closed_by_default_and_runs_when_open(
    make_app: MakeApp,
) -> None:
    seen: Seen = []
    down = "postgresql://127.0.0.1:1/jobs"  # nothing listens on port 1
    closed = _task(make_app(orbitive_store_url=down), seen)
    with pytest.raises(StoreError) as raised:
        closed.delay(1)
    assert raised.value.kind is ErrorKind.UNAVAILABLE
    skip = _task(make_app(orbitive_store_url=down), seen, lock_mode="skip")
    with pytest.raises(StoreError):
        skip.delay(1)  # the worker's side: the task fails, nothing runs
    assert seen == []
    opened = _task(make_app(orbitive_store_url=down), seen, on_store_error="open")
    assert opened.delay(1).get() == 3
    assert seen == [(1, None)]
