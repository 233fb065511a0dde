"""The placement contract's arguments and result (docs/DESIGN.md#placement): the tri-state
cpu_offload, offload policies (names, or torch's CPUOffloadPolicy / OffloadPolicy), the decision
as a Placement, and the spellings shared with the command ("cpu-pinned", "every-rank"), the
first API's accepted for one release with a DeprecationWarning."""

from __future__ import annotations

import os
import sys
import warnings
from ctypes import byref
from typing import NamedTuple

from . import _capi


def tri(cpu_offload) -> int:
    if cpu_offload is None:
        return _capi.CPU_OFFLOAD_INFER
    if cpu_offload is True:
        return _capi.CPU_OFFLOAD_ON
    if cpu_offload is False:
        return _capi.CPU_OFFLOAD_OFF
    raise TypeError(f"cpu_offload must be True, False or None (infer from the policy), not {cpu_offload!r}")


_HERE = os.path.dirname(os.path.abspath(__file__))
# the modules that only pass a spelling on: a warning names whoever gave it to them (the
# user's call; or a module of this package such as the drop-in, which must not use the old
# spellings: attributed there, the warning is hidden from its users by Python's default filters)
_PASS_THROUGH = {os.path.join(_HERE, "__init__.py"), os.path.join(_HERE, "_placement.py")}


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel of the first frame outside the pass-through modules."""
    level, f = 1, sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename) in _PASS_THROUGH:
        level, f = level + 1, f.f_back
    return level


# Spellings of the first Python API, accepted for one release: the command and plan files say
# "cpu-pinned" and "every-rank", and so does everything this package emits.
_OLD_SPELLINGS = {"cpu+pin": "cpu-pinned", "every_rank": "every-rank"}


def spelling(value, what: str):
    new = _OLD_SPELLINGS.get(value) if isinstance(value, str) else None
    if new is None:
        return value
    warnings.warn(f"{what} {value!r} is deprecated and goes in the next release: spell it {new!r}, as the "
                  "command and plan files do", DeprecationWarning, stacklevel=_caller_stacklevel())
    return new


_POLICIES = ("none", "cpu", "cpu-pinned")


def policy(offload_policy) -> _capi.OffloadPolicy | None:
    """None, "none", "cpu", "cpu-pinned", or anything shaped like torch's CPUOffloadPolicy /
    OffloadPolicy."""
    if offload_policy is None:
        return None
    if isinstance(offload_policy, str):
        offload_policy = spelling(offload_policy, "offload_policy")
        if offload_policy not in _POLICIES:
            raise ValueError(f"offload_policy {offload_policy!r}: use None, 'none', 'cpu' or 'cpu-pinned'")
        if offload_policy == "none":
            return _capi.OffloadPolicy(_capi.OFFLOAD_NONE, 0)
        return _capi.OffloadPolicy(_capi.OFFLOAD_CPU, int(offload_policy == "cpu-pinned"))
    cls = type(offload_policy).__name__
    if cls == "CPUOffloadPolicy":
        return _capi.OffloadPolicy(_capi.OFFLOAD_CPU, int(bool(getattr(offload_policy, "pin_memory", True))))
    if cls == "OffloadPolicy":  # FSDP2's base class: no offloading
        return _capi.OffloadPolicy(_capi.OFFLOAD_NONE, 0)
    raise TypeError(f"offload_policy: {cls} is neither torch's CPUOffloadPolicy/OffloadPolicy nor a string")


class Placement(NamedTuple):
    """A placement decision: DEVICE "cpu" (host memory) or "device" (the rank's accelerator; host
    memory on the cpu backend), the contract's RULE that chose it, and whether PINNED memory is
    wanted. A tuple, as the first API returned it."""
    device: str
    rule: str
    pinned: bool

    @property
    def torch_device(self):
        """The torch.device it means in this process: cpu, or torch's current accelerator
        (torch.accelerator; cpu where torch has none, as the cpu backend places there)."""
        import torch
        if self.device == "cpu":
            return torch.device("cpu")
        acc = getattr(torch, "accelerator", None)
        dev = acc.current_accelerator() if acc is not None and acc.is_available() else None
        if dev is None:
            return torch.device("cpu")
        return torch.device(dev.type, acc.current_device_index())


def resolve_placement(cpu_offload=None, offload_policy=None) -> Placement:
    """The placement contract (docs/DESIGN.md#placement): (device "cpu"/"device", rule, pinned)."""
    out = _capi.PlacementDecision()
    pol = policy(offload_policy)
    s = _capi.lib().sl_resolve_placement(tri(cpu_offload), byref(pol) if pol is not None else None, byref(out))
    if s:
        from . import ShardloadError
        raise ShardloadError(s, "resolve_placement: invalid arguments")
    return Placement(_capi.text(_capi.lib().sl_device_kind_name(out.device)),
                     _capi.text(_capi.lib().sl_placement_rule_describe(out.rule)), bool(out.pin_memory))
