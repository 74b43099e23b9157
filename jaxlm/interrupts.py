"""Ctrl-C and SIGTERM as exceptions: a command stops on either by unwinding through its `finally` blocks, and
a block that must not be cut short holds them until it is done."""
from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM, on which a command stops as it stops on Ctrl-C; its exit status is 128 + SIGTERM."""


def raise_for(received) -> None:
    """Raises Terminated where SIGTERM is among the `received` signals, else KeyboardInterrupt where any is."""
    if signal.SIGTERM in received:
        raise Terminated
    if received:
        raise KeyboardInterrupt


def _handled_here(number: int) -> bool:
    """Whether this thread may handle `number`: only the main thread sets handlers, and a signal ignored stays
    ignored (a job started in the background inherits SIGINT ignored)."""
    return threading.current_thread() is threading.main_thread() and signal.getsignal(number) not in (
        signal.SIG_IGN, None)


@contextlib.contextmanager
def sigterm_raises():
    """Inside the block SIGTERM raises Terminated, once; a second takes its default action, ending the process
    (a Terminated raised inside JAX's garbage-collection hook is ignored there). Its default action ended the
    process where it stood, silently: before the first step of a run, while it compiled, for one."""
    if not _handled_here(signal.SIGTERM) or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def on_sigterm(*_):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def held(raising: bool = False):
    """Yields the list that Ctrl-C and SIGTERM inside the block are appended to; where `raising`, each also
    raises at once (as `raise_for`). Without it, Python's handler raised wherever the program happened to be: a
    KeyboardInterrupt that lands in JAX's garbage-collection hook is ignored there, leaving no trace."""
    received = []
    taken = [number for number in (signal.SIGINT, signal.SIGTERM) if _handled_here(number)]

    def note(number, _):
        received.append(number)
        if raising:
            raise_for([number])

    previous = {number: signal.signal(number, note) for number in taken}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def deferred():
    """Ctrl-C and SIGTERM inside the block raise KeyboardInterrupt (Terminated) at the next call of the yielded
    check, not wherever Python happens to be, and at the block's end."""
    with held() as received:
        try:
            yield lambda: raise_for(received)
        finally:
            raise_for(received)
