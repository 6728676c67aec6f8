"""The data-prep process pool: ordered results, and workers that always stop."""

import signal

import pytest

from data_prep.parallel import WorkerPool


def _square(x: int) -> int:
    return x * x


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("bad record 3")
    return x


def _sigterm_disposition(_: int) -> str:
    handler = signal.getsignal(signal.SIGTERM)
    return "default" if handler is signal.SIG_DFL else repr(handler)


def test_results_come_back_in_input_order():
    with WorkerPool(2) as pool:
        assert [r for _, r in pool.map_ordered(_square, range(20))] == [x * x for x in range(20)]


def test_a_failing_record_stops_the_pool_and_names_itself():
    with pytest.raises(ValueError, match="bad record 3"), WorkerPool(2) as pool:
        list(pool.map_ordered(_fail_on_three, range(6)))


def test_workers_do_not_inherit_the_parents_sigterm_handler():
    # Launchers (torch elastic) and test runners install SIGTERM handlers that a fork inherits.
    # A worker running one that did not exit survived Pool.terminate(), whose join then hung
    # (seen in the full test suite); workers take SIGTERM's default action instead.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        with WorkerPool(2) as pool:
            seen = {r for _, r in pool.map_ordered(_sigterm_disposition, range(8))}
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == {"default"}


def _hang_ignoring_sigterm(x: int) -> int:
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
    return x


@pytest.mark.slow
def test_a_failure_stops_even_a_worker_that_ignores_sigterm():
    import time

    pool = WorkerPool(2)
    pending = [pool._pool.apply_async(_hang_ignoring_sigterm, (i,)) for i in range(2)]
    time.sleep(1.0)  # both workers are inside the call, SIGTERM ignored
    start = time.monotonic()
    pool.close(failed=True)  # Pool.terminate() alone would wait for them forever
    assert time.monotonic() - start < 30 and not any(p.ready() and p.successful() for p in pending)
