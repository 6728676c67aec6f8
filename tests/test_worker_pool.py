"""The data-prep process pool: ordered results, and workers that always stop."""

import signal

import pytest

from data_prep.parallel import WorkerLost, WorkerPool


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


def _killed_at_three(item: tuple[int, str, bool]) -> int:
    """SIGKILLs its own worker at 3: the first time only (a marker file says it happened), or every time."""
    import os
    from pathlib import Path

    x, marker, always = item
    if x == 3 and (always or not Path(marker).exists()):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def test_a_worker_killed_holding_a_batch_is_replaced_and_the_batch_sent_again(tmp_path, caplog):
    # multiprocessing.Pool replaces a dead worker but waits for ever for the batch it held (a suite run hung
    # in prepare so): the map sees the exit, and a fresh pool gets the pending batches again.
    items = [(x, str(tmp_path / "killed"), False) for x in range(8)]
    with caplog.at_level("WARNING", logger="data_prep.parallel"), WorkerPool(2) as pool:
        assert [r for _, r in pool.map_ordered(_killed_at_three, items)] == [x * x for x in range(8)]
    assert (tmp_path / "killed").exists()  # the kill did happen
    (warning,) = [r.getMessage() for r in caplog.records if "data-prep worker exited" in r.getMessage()]
    assert "killed by SIGKILL" in warning and "pending batches again to 2 fresh workers" in warning


def test_a_worker_killed_again_fails_the_map_saying_how_it_ended(tmp_path):
    items = [(x, str(tmp_path / "killed"), True) for x in range(8)]
    with pytest.raises(WorkerLost, match=r"a data-prep worker exited .*pid \d+ killed by SIGKILL.*lower data.workers"):
        with WorkerPool(2) as pool:
            list(pool.map_ordered(_killed_at_three, items))
