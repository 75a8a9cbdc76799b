"""subscribe() and trace(): events reach Python from a thread of the subscription, never from
inside the hook; a slow consumer loses events (counted), never the allocating thread's time; a
raising callback is reported once and delivery goes on."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest

import cuhook
from cuhook import EventKind, MemType

MiB = 1 << 20


def test_events_arrive_in_order_on_the_subscription_thread(installed):
    got = []
    me = threading.get_native_id()

    def on_event(ev):
        got.append((ev, threading.current_thread().name))

    with cuhook.subscribe(on_event) as sub:
        p = installed.malloc(2 * MiB)
        installed.free(p)
        assert sub.flush(10)
    assert [(e.kind, e.address, e.size, e.api, e.mem_type, e.device, e.tid) for e, _ in got] == [
        (EventKind.ALLOC, p, 2 * MiB, "cudaMalloc", MemType.CUDA, 0, me),
        (EventKind.FREE, p, 2 * MiB, "cudaFree", MemType.CUDA, 0, me),
    ]
    # Python ran on the subscription's thread, not inside the hook on the allocating one.
    assert {name for _, name in got} == {"cuhook-events"}
    assert got[0][0].time_ns <= got[1][0].time_ns
    assert abs(got[0][0].time_ns - time.time_ns()) < 60 * 10**9
    assert sub.delivered == 2 and sub.dropped == 0 and sub.errors == 0


def test_after_close_the_callback_is_not_called(installed):
    got = []
    sub = cuhook.subscribe(got.append)
    installed.free(installed.malloc(MiB))
    sub.flush(10)
    sub.close()
    sub.close()                                   # idempotent
    installed.free(installed.malloc(MiB))
    time.sleep(0.05)
    assert len(got) == 2


def test_an_event_mask_selects_kinds(installed):
    allocs, frees = [], []
    with cuhook.subscribe(allocs.append, EventKind.ALLOC) as a, \
            cuhook.subscribe(frees.append, events=EventKind.FREE) as f:
        p = installed.malloc(MiB)
        installed.free(p)
        a.flush(10)
        f.flush(10)
    assert [(e.kind, e.address) for e in allocs] == [(EventKind.ALLOC, p)]
    assert [(e.kind, e.address) for e in frees] == [(EventKind.FREE, p)]


@pytest.mark.parametrize("events,capacity", [(0, 16), (4, 16), ("alloc", 16), (3, 0),
                                             (3, 1 << 25)])
def test_bad_subscriptions_are_refused(events, capacity):
    with pytest.raises(ValueError):
        cuhook.subscribe(print, events, capacity)


def test_a_callback_that_is_not_callable_is_a_type_error():
    with pytest.raises(TypeError):
        cuhook.subscribe(42)


def test_a_raising_subscriber_is_reported_once_and_delivery_goes_on(installed, caplog):
    calls = []
    good = []

    def bad(ev):
        calls.append(ev)
        raise RuntimeError(f"boom {len(calls)}")

    caplog.set_level(logging.ERROR, logger="cuhook")
    with cuhook.subscribe(bad) as b, cuhook.subscribe(good.append) as g:
        for _ in range(5):
            installed.free(installed.malloc(MiB))
        assert b.flush(10) and g.flush(10)
    records = [r for r in caplog.records if r.name == "cuhook"]
    assert len(records) == 1 and "raised" in records[0].getMessage()
    assert records[0].exc_info and "boom 1" in str(records[0].exc_info[1])
    assert len(calls) == 10 and b.errors == 10 and b.delivered == 10
    assert str(b.first_error) == "boom 1"
    assert len(good) == 10                        # the other subscriber lost nothing


def test_a_slow_consumer_drops_and_counts_and_never_blocks_the_allocating_thread(installed):
    release = threading.Event()
    seen = []

    def slow(ev):
        seen.append(ev)
        release.wait(30)

    with cuhook.subscribe(slow, capacity=4) as sub:
        start = time.monotonic()
        for _ in range(50):
            installed.free(installed.malloc(4096))  # 100 events for a queue of 4
        took = time.monotonic() - start
        release.set()
        assert sub.flush(10)
        counts = sub._counts()
    assert took < 20                              # it did not wait for the consumer
    assert counts.queued + counts.dropped == 100 and counts.dropped >= 100 - 4 - 256
    assert counts.dropped > 0
    assert len(seen) == sub.delivered == counts.queued


def test_close_from_inside_the_callback_stops_delivery(installed):
    got = []
    holder = {}

    def once(ev):
        got.append(ev)
        holder["sub"].close()

    holder["sub"] = cuhook.subscribe(once)
    installed.free(installed.malloc(MiB))
    deadline = time.monotonic() + 10
    while holder["sub"]._queue is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    installed.free(installed.malloc(MiB))
    time.sleep(0.05)
    assert len(got) == 1 and holder["sub"]._queue is None


def test_events_of_every_thread_are_delivered(installed):
    got = []
    tids = []
    with cuhook.subscribe(got.append) as sub:
        def work():
            tids.append(threading.get_native_id())
            for _ in range(20):
                installed.free(installed.malloc(8192))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sub.flush(10)
    assert len(got) == 160 and sub.dropped == 0
    assert {e.tid for e in got} == set(tids)
    for tid in tids:                              # each thread's events in its order
        mine = [e.kind for e in got if e.tid == tid]
        assert mine == [EventKind.ALLOC, EventKind.FREE] * 20


def test_a_callback_may_itself_allocate(installed):
    got = []

    def allocating(ev):
        got.append(ev)
        if ev.size == 3 * MiB and ev.kind == EventKind.ALLOC:
            installed.free(installed.malloc(MiB))  # CUDA from the callback: no deadlock

    with cuhook.subscribe(allocating) as sub:
        p = installed.malloc(3 * MiB)
        assert sub.flush(10)
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        installed.free(p)
        assert sub.flush(10)
    assert [(e.kind, e.size) for e in got] == [
        (EventKind.ALLOC, 3 * MiB), (EventKind.ALLOC, MiB), (EventKind.FREE, MiB),
        (EventKind.FREE, 3 * MiB)]


# ------------------------------------------------------------------------ traces


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_a_trace_holds_the_events_of_its_block_only(installed, tmp_path):
    path = tmp_path / "t.jsonl"
    before = installed.malloc(MiB)
    with cuhook.trace(path) as t:
        p = installed.malloc(2 * MiB)
        installed.free(p)
    installed.free(before)
    lines = _lines(path)
    assert [(x["event"], int(x["address"], 16), x["size"], x["api"], x["mem_type"])
            for x in lines] == [("alloc", p, 2 * MiB, "cudaMalloc", "cuda"),
                                ("free", p, 2 * MiB, "cudaFree", "cuda")]
    assert all(x["tid"] == threading.get_native_id() for x in lines)
    t.close()                                     # idempotent


def test_a_trace_name_expands_the_pid_and_appends(installed, tmp_path):
    with cuhook.trace(str(tmp_path / "t.%p.jsonl")):
        installed.free(installed.malloc(MiB))
    path = tmp_path / f"t.{os.getpid()}.jsonl"
    with cuhook.trace(path):
        installed.free(installed.malloc(MiB))
    assert [x["event"] for x in _lines(path)] == ["alloc", "free", "alloc", "free"]


def test_a_trace_that_cannot_be_opened_is_an_error(tmp_path):
    with pytest.raises(cuhook.CuhookError) as e:
        cuhook.trace(tmp_path / "no-such-dir" / "t.jsonl")
    assert e.value.status == -10                   # CUHOOK_ERR_IO
    os.symlink(tmp_path / "target", tmp_path / "link")
    with pytest.raises(cuhook.CuhookError):        # never through a symbolic link
        cuhook.trace(tmp_path / "link")
    assert not (tmp_path / "target").exists()


def test_a_forked_child_gets_its_own_events(installed):
    """A process that forks with a subscription open: the child's allocations reach the
    callback in the child (its own delivery thread; the parent's does not exist there), and the
    parent's subscription goes on."""
    got = []
    with cuhook.subscribe(got.append) as sub:
        installed.free(installed.malloc(MiB))
        assert sub.flush(10)
        assert len(got) == 2
        pid = os.fork()
        if pid == 0:
            ok = False
            try:
                p = installed.malloc(3 * MiB)
                installed.free(p)
                ok = sub.flush(10) and [(e.kind, e.address, e.size) for e in got[2:]] == [
                    (EventKind.ALLOC, p, 3 * MiB), (EventKind.FREE, p, 3 * MiB)]
                sub.close()
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        installed.free(installed.malloc(MiB))
        assert sub.flush(10)
        assert len(got) == 4
