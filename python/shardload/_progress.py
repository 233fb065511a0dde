"""Progress of one load on rank 0: the caller's callback and a tqdm bar.

The library reports progress on rank 0 only, after each tensor whose bytes are all in place
(sl_load_options.progress_status: done and total bytes, the total being the file bytes of the
tensors the plan takes). The tensor counts are this package's: the taken tensors' file sizes
in file order (the order they load in), so that after K tensors done_bytes is their sum.

The bar is on when asked for (progress_bar=True, $SHARDLOAD_PROGRESS=1), else when tqdm is
importable and stderr is a terminal; a bar's own failure (a closed stderr) turns it off and
never fails the load: a bar is cosmetic, and only rank 0 has one, so it must not make rank 0
fail where the others succeed.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
import logging
import os
import sys
from typing import Callable, Sequence

_log = logging.getLogger("shardload")
_ENV = "SHARDLOAD_PROGRESS"
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def bar_wanted(arg: bool | None) -> bool:
    """progress_bar=ARG, then $SHARDLOAD_PROGRESS, then whether stderr is a terminal. Checked on
    every rank alike (a bad argument fails every rank before the load; a bad $SHARDLOAD_PROGRESS
    warns and gives no bar)."""
    if arg is not None:
        if not isinstance(arg, bool):
            raise TypeError(f"progress_bar must be True, False or None (a bar when stderr is a terminal), "
                            f"not {arg!r}")
        return arg
    env = os.environ.get(_ENV, "").strip().lower()
    if env in _ON:
        return True
    if env in _OFF:
        return False
    if env:
        # a warning, never an error: the variable is read on each rank alone, before the ranks
        # agree on anything, so an error here would fail one rank and leave the others waiting
        _log.warning("shardload: $%s=%r: give 1 (a bar on rank 0) or 0 (none), or unset it (a bar when stderr "
                     "is a terminal); no bar", _ENV, os.environ[_ENV])
        return False
    err = sys.stderr
    try:
        return err is not None and err.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


def _takes_four(fn: Callable) -> bool:
    """Whether FN takes (done_bytes, total_bytes, done_tensors, total_tensors); one that takes
    only two positional arguments (the first API's progress) gets the bytes alone."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the full form
        return True
    try:
        sig.bind(0, 0, 0, 0)
        return True
    except TypeError:
        return False


class LoadProgress:
    """progress(done, total) for _calls.progress_callback: computes the tensor counts, calls the
    caller's FN and moves the BAR."""

    def __init__(self, fn: Callable | None, bar: bool, sizes: Sequence[int]):
        self.fn = fn
        self.four = fn is not None and _takes_four(fn)
        self.cum = list(itertools.accumulate(sizes))
        self.total_tensors = len(self.cum)
        self.total_bytes = self.cum[-1] if self.cum else 0
        self.calls = 0
        self.bar = _make_bar(self.total_bytes, self.total_tensors) if bar else None

    def tensors_done(self, done: int, total: int) -> int:
        self.calls += 1
        if total != self.total_bytes:  # not the table the library loads by: count its reports
            return min(self.calls, self.total_tensors)
        return bisect.bisect_right(self.cum, done)

    def __call__(self, done: int, total: int) -> None:
        tensors = self.tensors_done(done, total)
        if self.bar is not None:
            self._move_bar(done, tensors)
        if self.fn is not None:
            if self.four:
                self.fn(done, total, tensors, self.total_tensors)
            else:
                self.fn(done, total)

    def _move_bar(self, done: int, tensors: int) -> None:
        try:
            self.bar.set_postfix_str(f"{tensors}/{self.total_tensors} tensors", refresh=False)
            self.bar.update(done - self.bar.n)
        except Exception as e:
            _log.warning("shardload: progress bar off: %s", e)
            self._drop_bar()

    def _drop_bar(self) -> None:
        bar, self.bar = self.bar, None
        if bar is not None:
            try:
                bar.close()
            except Exception:
                pass

    def close(self) -> None:
        self._drop_bar()


def _make_bar(total_bytes: int, total_tensors: int):
    """A tqdm bar of bytes (rate and time left in binary units) on stderr, or None without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        _log.warning("shardload: a progress bar was asked for, but tqdm is not installed (pip install tqdm)")
        return None
    try:
        return tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="shardload",
                    file=sys.stderr, disable=False, dynamic_ncols=True, leave=True,
                    postfix=f"0/{total_tensors} tensors")
    except Exception as e:  # a bar is never worth a load (rank 0's failing would fail every rank)
        _log.warning("shardload: progress bar off: %s", e)
        return None
