"""Clean stops: SIGINT / SIGTERM end a long command without orphans or tracebacks.

:func:`install` (called by the ``granisim`` entry point) turns either signal into
:class:`Stopped`, a ``BaseException`` that unwinds the driver like ``KeyboardInterrupt``
does; the entry point prints one line (how to resume) and exits ``128 + signal``
(130 for SIGINT, 143 for SIGTERM). Later signals are ignored for ``UNWIND_S`` while the stop
unwinds; one after that ends the process at once (exit ``128 + signal``): the first stop was swallowed
where it landed (a ``__del__`` or a garbage-collector callback reports and drops exceptions) or is stuck.
:func:`requested` says whether a stop was asked for, so that code which catches every exception (the
fuzzer's hypothesis) can tell a stop from a failure.

:func:`process_pool` is a ``ProcessPoolExecutor`` (forkserver) whose workers ignore SIGINT
(a Ctrl-C reaches the whole foreground process group; the driver alone decides) and which,
when the driver unwinds with any exception, terminates its workers and stops the forkserver
(the resource tracker then exits with the driver) instead of waiting for the points in flight. A sweep's finished
points are already on disk (one part file per point), so nothing finished is lost.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor

SIGNALS = (signal.SIGINT, signal.SIGTERM)
UNWIND_S = 5.0  # later signals ignored for this long after the first: the stop's unwinding is not cut short

_first: tuple[int, float] | None = None  # the first signal of this process and when it came (monotonic)


class Stopped(BaseException):
    """The command was stopped by a signal (``signum``)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise_stopped(signum, _frame):
    global _first
    if _first is None:
        _first = (int(signum), time.monotonic())
        raise Stopped(signum)
    if time.monotonic() - _first[1] < UNWIND_S:  # one stop at a time: let the first unwind
        return
    os.write(2, f"stopped by {signal.Signals(signum).name}: ended at once\n".encode())
    os._exit(128 + int(signum))


def requested() -> Stopped | None:
    """The stop asked for by a signal since :func:`install`, if any (whether or not it unwound)."""
    return Stopped(_first[0]) if _first is not None else None


def _unraisable(hook):
    """``sys.unraisablehook`` that says nothing of a swallowed :class:`Stopped` (it is raised again where
    :func:`requested` is read, or a second signal ends the process)."""
    def quiet(unraisable):
        if not isinstance(unraisable.exc_value, Stopped):
            hook(unraisable)
    quiet.quiets = hook
    return quiet


def install() -> None:
    """SIGINT and SIGTERM raise :class:`Stopped` in the main thread."""
    global _first
    _first = None
    if not hasattr(sys.unraisablehook, "quiets"):
        sys.unraisablehook = _unraisable(sys.unraisablehook)
    for s in SIGNALS:
        signal.signal(s, _raise_stopped)


def _worker_init() -> None:
    """A pool worker: SIGINT ignored (the driver stops it), SIGTERM ends it. Its tqdm bars (disabled
    ones too) lock with a thread lock: tqdm's default lock is a multiprocessing semaphore, which a
    terminated worker would leave registered ("leaked semaphore" warning at exit)."""
    import threading

    from tqdm import tqdm

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    tqdm.set_lock(threading.RLock())


def _stop_forkserver() -> None:
    """Stop the forkserver this process started (a no-op if none). The resource tracker needs no
    help: it exits when this process does, once the pool's semaphores are released."""
    from multiprocessing import forkserver

    with contextlib.suppress(Exception):
        forkserver._forkserver._stop()


def terminate(ex: ProcessPoolExecutor, grace_s: float = 10.0) -> None:
    """Terminate ``ex``'s workers (SIGTERM, then SIGKILL after ``grace_s``), drop its queued work,
    and stop the forkserver."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(grace_s)
            if p.is_alive():
                p.kill()
                p.join(grace_s)
    with contextlib.suppress(Exception):
        ex.shutdown(wait=False, cancel_futures=True)
    _stop_forkserver()


@contextlib.contextmanager
def process_pool(workers: int, preload: list[str] | None = None):
    """A forkserver ``ProcessPoolExecutor`` of ``workers`` processes that ignore SIGINT; on an
    exception in the ``with`` body (a stop, an error) its workers are terminated at once."""
    ctx = mp.get_context("forkserver")
    if preload:
        ctx.set_forkserver_preload(preload)
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init)
    try:
        yield ex
    except BaseException:
        terminate(ex)
        raise
    ex.shutdown(wait=True)
