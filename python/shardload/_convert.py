"""Values that cross into C, checked first: ctypes would otherwise truncate a string at its
first NUL ("w\\0tail" becomes "w") and wrap an integer modulo 2**bits (a mesh dim of 2**32+1
becomes 1), both silently. Every str, path and int the package hands libshardload goes
through one of these; each error names the argument and what it accepts."""

from __future__ import annotations

import math
import operator
import os
from ctypes import c_int, c_size_t, sizeof

INT_MAX = (1 << (8 * sizeof(c_int) - 1)) - 1
SIZE_MAX = (1 << (8 * sizeof(c_size_t))) - 1


def cstr(value, what: str) -> bytes | None:
    """A str (or None) as a C string; refuses an embedded NUL, as Python's own open() does."""
    if value is None:
        return None
    if isinstance(value, bytes):
        b = value
    elif isinstance(value, str):
        b = value.encode()
    else:
        raise TypeError(f"{what} must be a str, not {type(value).__name__} ({value!r})")
    if b"\0" in b:
        head = b.split(b"\0", 1)[0].decode(errors="replace")
        raise ValueError(f"{what} {value!r} contains an embedded null character: C would read it as "
                         f"{head!r}; remove it")
    return b


def cpath(value, what: str = "path") -> bytes:
    """A path (str, bytes or os.PathLike) as a C string, in the file system's encoding."""
    b = os.fsencode(value)
    if b"\0" in b:
        head = os.fsdecode(b.split(b"\0", 1)[0])
        raise ValueError(f"{what} {value!r} contains an embedded null byte: C would read it as "
                         f"{head!r}; remove it")
    return b


def cmsg(text: str) -> bytes:
    """Free text for a C message: a NUL is shown, not allowed to cut the message short."""
    return str(text).replace("\0", "\\0").encode(errors="replace")


def cint(value, what: str, lo: int = 0, hi: int = INT_MAX) -> int:
    """An integer in [lo, hi] (bool and float refused: C would read True as 1 and 2.9 as 2)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be an integer, not {type(value).__name__} ({value!r})")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise ValueError(f"{what}={v} is out of range: give an integer from {lo} to {hi}")
    return v


def ctimeout_ms(seconds, what: str = "timeout") -> int:
    """A timeout in seconds as the C int of milliseconds (at least 1 ms)."""
    if isinstance(seconds, bool):
        raise TypeError(f"{what} must be a number of seconds, not {seconds!r}")
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__} ({seconds!r})") from None
    limit = INT_MAX / 1000
    if not (math.isfinite(s) and 0 < s <= limit):
        raise ValueError(f"{what}={seconds!r} s is out of range: give more than 0 and at most {limit} seconds")
    return max(1, min(INT_MAX, int(s * 1000)))
