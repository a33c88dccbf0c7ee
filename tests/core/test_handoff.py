"""handoff: a Ctrl-C at any bytecode of a hand-off leaves no lock held (tarserve hung once on it)."""

from __future__ import annotations

import dis
import itertools
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tarproc.handoff import Condition, Handoff

# Where CPython 3.11 runs a pending signal's handler: entering a function (RESUME), after a
# call (CALL) and at a loop's jump back; a tracer stands in for the handler at those points only
# (it could raise elsewhere too, where no Ctrl-C can come: at a NOP, or right after BEFORE_WITH)
_AFTER = {"CALL", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT"}


def interrupted_at(k: int, operation: Callable[[], Any]) -> bool:
    """Run ``operation`` raising KeyboardInterrupt, as a Ctrl-C would, at the ``k``-th point of
    its Python code where one can come: on entering a function, as a call returns (at the
    callee's return, or after a C function's call), after a jump back; whether it was interrupted."""
    points = itertools.count()
    last: dict[Any, str] = {}  # each frame's last bytecode

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            op = dis.opname[frame.f_code.co_code[frame.f_lasti]]
            point, last[frame] = last.get(frame) in _AFTER, op
        else:
            point = event in ("call", "return")
        if point and next(points) == k:
            raise KeyboardInterrupt
        return tracer

    sys.settrace(tracer)
    try:
        operation()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def held_by_someone(lock: Any) -> bool:
    """Whether another thread can't take ``lock`` (an RLock is re-entrant in its owner)."""
    free: list[bool] = []
    thread = threading.Thread(target=lambda: free.append(lock.acquire(timeout=0.5) and (lock.release() or True)))
    thread.start()
    thread.join()
    return not free[0]


def with_block(condition: Any) -> None:
    with condition:
        pass


def test_the_plain_condition_leaks_its_lock_to_an_interrupt_the_reason_for_this_module() -> None:
    leaked = []
    for k in itertools.count():
        condition = threading.Condition(threading.Lock())
        if not interrupted_at(k, lambda c=condition: with_block(c)):
            break
        leaked.append(held_by_someone(condition._lock))  # type: ignore[attr-defined]
    assert any(leaked)  # somewhere between the lock's acquire and the with block: held for ever


@pytest.mark.parametrize("shared", [False, True])
def test_a_with_block_on_a_condition_leaves_no_lock_held_wherever_the_interrupt_comes(shared: bool) -> None:
    for k in itertools.count():
        condition = Condition(threading.RLock()) if shared else Condition()
        interrupted = interrupted_at(k, lambda c=condition: with_block(c))
        assert not held_by_someone(condition._lock), k  # type: ignore[attr-defined]
        if not interrupted:
            break
    assert k > 0  # the tracer did interrupt it (else this test proves nothing)


def test_a_condition_still_waits_and_is_notified() -> None:
    condition, ready = Condition(), []

    def later() -> None:
        with condition:
            ready.append(1)
            condition.notify_all()

    with condition:
        threading.Thread(target=later).start()
        assert condition.wait_for(lambda: ready, timeout=30)


@pytest.mark.parametrize("operation", ["put", "get"])
def test_a_handoff_interrupted_anywhere_goes_on_for_the_other_thread_and_the_clean_up(operation: str) -> None:
    for k in itertools.count():
        handoff: Handoff[int] = Handoff(3)
        handoff.put(1, timeout=5)
        interrupted = interrupted_at(k, lambda h=handoff: h.put(2, timeout=5) if operation == "put" else h.get(timeout=5))
        # the other thread gives (an interrupt costs a place at most), and the clean-up drains:
        # none of it waits for ever (the item being handed over may be lost: it was interrupted)
        giver = threading.Thread(target=lambda h=handoff: h.put(3, timeout=30))
        giver.start()
        giver.join()
        drained = [handoff.get(timeout=30)]
        while handoff.qsize():
            drained.append(handoff.get_nowait())
        assert drained[-1] == 3 and set(drained) <= {1, 2, 3}, k
        if not interrupted:
            break
    assert k > 0


def test_a_handoff_is_bounded_and_first_in_first_out() -> None:
    handoff: Handoff[str] = Handoff(2)
    handoff.put("a")
    handoff.put("b", timeout=1)
    with pytest.raises(queue.Full):
        handoff.put("c", timeout=0)
    assert handoff.get() == "a" and handoff.get_nowait() == "b"
    with pytest.raises(queue.Empty):
        handoff.get(timeout=0)
    with pytest.raises(ValueError, match="at least 1"):
        Handoff(0)
