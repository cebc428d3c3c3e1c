"""Who calls the ``mpi`` runner (``_utils/mpi_caller.py``): the API engine marks the worker
thread that runs a hub user's call, and only that thread, for the call's length. A mark
left behind, or seen by another thread, would let one user act as another or as an admin.
Threads meet on barriers and events with timeouts: nothing sleeps, and a lost thread
fails the test instead of hanging it."""

import concurrent.futures
import threading

import pytest

from tests.extension import load_extension

caller = load_extension("_utils/mpi_caller.py", "mpi_caller")
runner = load_extension("_runners/mpi.py", "mpi_runner_for_caller")

#: Long enough for any thread to get its turn on a busy machine; only a failure waits it.
TIMEOUT = 30


def _in_thread(function):
    """``function()``'s result or exception, run in a new thread."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(function).result(timeout=TIMEOUT)


def test_no_mark_is_an_admin():
    assert caller.hub_user() is None


def test_the_mark_holds_in_the_block_only():
    with caller.as_hub_user("alice") as entered:
        assert entered is None
        assert caller.hub_user() == "alice"
    assert caller.hub_user() is None


def test_only_the_calling_thread_is_marked():
    with caller.as_hub_user("alice"):
        assert _in_thread(caller.hub_user) is None
        assert caller.hub_user() == "alice"


def test_threads_marked_at_once_each_see_their_own_user():
    names = ["alice", "bob", "carol", "dave"]
    inside = threading.Barrier(len(names), timeout=TIMEOUT)
    seen = {}

    def call(name):
        try:
            with caller.as_hub_user(name):
                inside.wait()  # every thread is marked now
                seen[name] = caller.hub_user()
                inside.wait()  # none has left its block before all have looked
        except BaseException:
            inside.abort()  # the others stop waiting for this one
            raise
        return caller.hub_user()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
        after = list(pool.map(call, names, timeout=TIMEOUT))
    assert seen == {name: name for name in names}
    assert after == [None] * len(names)
    assert caller.hub_user() is None


def test_an_exception_in_the_block_clears_the_mark_and_goes_on():
    with pytest.raises(KeyError, match="boom"):
        with caller.as_hub_user("alice"):
            raise KeyError("boom")
    assert caller.hub_user() is None


def test_a_pooled_thread_comes_back_unmarked_after_a_failed_call():
    # as the engine's workers: one thread serves one user's call, then the next caller's
    def failing_call():
        with caller.as_hub_user("alice"):
            raise RuntimeError("the call failed")

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        with pytest.raises(RuntimeError, match="the call failed"):
            pool.submit(failing_call).result(timeout=TIMEOUT)
        assert pool.submit(caller.hub_user).result(timeout=TIMEOUT) is None


def test_nesting_is_refused_and_leaves_the_outer_mark():
    with caller.as_hub_user("alice"):
        with pytest.raises(RuntimeError, match="already acts for a hub user"):
            with caller.as_hub_user("bob"):
                pytest.fail("a nested block ran")
        with pytest.raises(RuntimeError, match="already acts for a hub user"):
            with caller.as_hub_user("alice"):
                pytest.fail("a nested block ran")
        assert caller.hub_user() == "alice"
    assert caller.hub_user() is None


@pytest.mark.parametrize("name", ["", None, 0, b"alice", ["alice"]])
def test_no_name_is_refused_and_marks_nothing(name):
    with pytest.raises(ValueError, match="a hub user name is required"):
        with caller.as_hub_user(name):
            pytest.fail("the block ran without a name")
    assert caller.hub_user() is None


def test_the_runner_takes_a_marked_thread_for_that_hub_user(monkeypatch):
    monkeypatch.setattr(runner, "__utils__", {"mpi_caller.hub_user": caller.hub_user},
                        raising=False)
    assert runner._hub_identity() is None
    with caller.as_hub_user("Ann.Lee@example.org"):
        assert runner._hub_identity() == "Ann.Lee@example.org"
        assert _in_thread(runner._hub_identity) is None  # an admin elsewhere stays one
    assert runner._hub_identity() is None
