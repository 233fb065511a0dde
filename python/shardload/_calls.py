"""C calls that a signal can end, and Python callbacks that never unwind into C.

Signals. CPython runs a signal's Python handler in the main thread, between bytecodes; while
the main thread sits inside a ctypes call that waits on peers (a rendezvous, a load), Ctrl-C
is seen only once the call returns: after the whole load, or never where a callback swallowed
it. `blocking` therefore runs such a call in a worker thread (ctypes releases the GIL), with
SIGINT and SIGTERM blocked there (and in the threads the library starts from it), so that the
signal reaches the main thread, which waits for the worker interruptibly. A KeyboardInterrupt
(any BaseException) in that wait aborts the call's context (sl_context_abort, safe from any
thread: the call fails on every rank at once), cancels the call's callbacks (they fail at
once instead of running user code), waits for the worker, undoes what the call made had it
succeeded meanwhile, and is raised. Context creation has no context to abort yet: its worker
is left to finish and undo alone, and the exception is raised at once.

Callbacks. An exception that leaves a ctypes callback is printed and dropped, and C receives
an undefined return value (a read callback's KeyboardInterrupt could read as success and
place a staging slot's stale bytes). Every callback catches BaseException, keeps the first in
the call's Trap and fails the call through its status (the read and bind callbacks, and the
progress callback as sl_load_options.progress_status); the caller raises it once the C call
has returned.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading

_POLL_S = 0.25  # the main thread's wait also wakes this often, wherever a signal landed
_MASKED = {getattr(signal, n) for n in ("SIGINT", "SIGTERM") if hasattr(signal, n)}


class Trap:
    """The first exception a Python callback raised during one C call and which callback
    (`where`); `cancelled` once the caller was interrupted (the callbacks then fail without
    running user code)."""

    __slots__ = ("exc", "where", "cancelled")

    def __init__(self):
        self.exc: BaseException | None = None
        self.where = ""
        self.cancelled = False

    def catch(self, exc: BaseException, where: str) -> None:
        if self.exc is None:
            self.exc, self.where = exc, where


def text_of(exc: BaseException) -> str:
    """'Type: message' of EXC; never raises, whatever the exception's __str__ does."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except BaseException:
        return type(exc).__name__


def describe(exc: BaseException, limit: int) -> bytes:
    """text_of(EXC) for a C message buffer: at most LIMIT bytes, a NUL shown as \\0."""
    return text_of(exc).replace("\0", "\\0").encode("utf-8", "replace")[:limit]


def progress_callback(fn, trap: Trap):
    """sl_load_options.progress_status over FN(done, total): an exception fails the load on
    every rank within one status window, as a failure of rank 0's (the context stays usable),
    and FN is not called again."""
    from ._capi import PROGRESS_STATUS_FN, status_enum
    ok, failed = int(status_enum().OK), int(status_enum().ERR_INVALID)  # failed: the message says how

    def call(user, done, total, message, length):
        try:
            if trap.cancelled:
                raise KeyboardInterrupt("the load was interrupted")
            fn(int(done), int(total))
            return ok
        except BaseException as e:
            trap.catch(e, "progress")
            if message and length > 0:
                text = describe(e, int(length) - 1)
                ctypes.memmove(message, text + b"\0", len(text) + 1)
            return failed
    return PROGRESS_STATUS_FN(call)


class TrapRef:
    """Where a callback that outlives one call (a memory source's read) finds the Trap of the
    call running now (None between calls)."""

    __slots__ = ("trap",)

    def __init__(self):
        self.trap: Trap | None = None


def _thread_state() -> list:
    """Setters that give the worker the caller's torch thread state (grad mode, current CUDA
    device), so that callbacks running there allocate where they would have in the caller."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "is_grad_enabled"):
        return []
    grad = torch.is_grad_enabled()
    out = [lambda: torch.set_grad_enabled(grad)]
    try:
        if torch.cuda.is_initialized():
            dev = torch.cuda.current_device()
            out.append(lambda: torch.cuda.set_device(dev))
    except Exception:  # a torch without CUDA support
        pass
    return out


class _Call:
    """One blocking call in its worker; `undo(result)` releases what it made when nobody will
    take it (the caller was interrupted)."""

    def __init__(self, fn, args, undo):
        self.fn, self.args, self.undo = fn, args, undo
        self.result = self.error = None
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._finished = self._abandoned = False
        self._setup = _thread_state()

    def run(self) -> None:
        try:
            for f in self._setup:
                f()
            self.result = self.fn(*self.args)
        except BaseException as e:  # raised in the caller's thread
            self.error = e
        finally:
            with self._lock:
                self._finished = True
                abandoned = self._abandoned
            if abandoned:
                self._undo()
            self.done.set()  # after the undo: whoever waits sees it complete

    def _undo(self) -> None:
        if self.undo is not None and self.error is None:
            try:
                self.undo(self.result)
            except Exception:
                pass

    def abandon(self) -> None:
        """Nobody takes the result: undo it now if the call has finished, else when it does."""
        with self._lock:
            if not self._finished:
                self._abandoned = True
                return
        self._undo()


def blocking(fn, *args, abort=None, trap: Trap | None = None, undo=None, started=None):
    """fn(*args), a ctypes call that may wait on peers, run so that a signal can end it.
    abort(): ends the call early on every rank (sl_context_abort of its context), or None where
    there is nothing to abort yet. undo(result): releases what the call made, should it succeed
    after the caller was interrupted. started(event): told the event set once the call has
    finished (the context keeps it, so that close() never destroys what a call still uses)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return fn(*args)  # signals reach only the main thread: nothing to wait for here
    call = _Call(fn, args, undo)
    worker = threading.Thread(target=call.run, name="shardload-call", daemon=True)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _MASKED)  # inherited by the worker
    try:
        worker.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    if started is not None:
        started(call.done)
    try:
        while not call.done.wait(_POLL_S):
            pass
    except BaseException:
        if trap is not None:
            trap.cancelled = True
        call.abandon()
        if abort is not None:
            abort()
            # within the timeout, at once on Gloo (its abort shuts the sockets); a second Ctrl-C
            # meanwhile must not return while the call still runs the caller's callbacks
            while True:
                try:
                    call.done.wait()
                    break
                except KeyboardInterrupt:
                    continue
        raise
    if call.error is not None:
        raise call.error
    return call.result
