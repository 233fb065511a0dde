"""Progress of a load: the caller's callback (bytes and tensors, rank 0), its failure, and the
tqdm bar (forced by the argument or $SHARDLOAD_PROGRESS, else on only when stderr is a terminal:
checked under a real pseudo-terminal)."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import select
import struct
import subprocess
import sys
import termios

import pytest

import shardload

from conftest import REPO


def load(path, plan_fn=None, **kw):
    with shardload.Context(backend="cpu") as ctx:
        plan = plan_fn(ctx) if plan_fn else ctx.plan()
        return ctx.load(plan, ctx.open(path), **kw)


def test_callback_counts_bytes_and_tensors(checkpoint):
    path, sd = checkpoint
    calls = []
    load(path, progress=lambda *a: calls.append(a))
    total = sum(t.numel() * t.element_size() for t in sd.values())
    assert calls and all(len(c) == 4 for c in calls)
    assert calls[-1] == (total, total, len(sd), len(sd)), calls
    for (d0, _, k0, _), (d1, _, k1, _) in zip(calls, calls[1:]):
        assert d0 < d1 and k0 < k1  # one call per tensor with bytes, both counts growing
    # the counts agree with the bytes: after K tensors, done is the first K tensors' bytes (file order)
    with shardload.Context(backend="cpu") as ctx:
        sizes = [t.nbytes for t in ctx.open(path)]
    for done, _, k, _ in calls:
        assert sum(sizes[:k]) == done, (done, k, sizes)


def test_callback_totals_are_the_taken_tensors(checkpoint):
    path, sd = checkpoint
    calls = []

    def plan(ctx):
        return ctx.plan().add_entry("a.weight").add_entry("ids")  # non-strict: the rest skipped
    st = load(path, plan, progress=lambda *a: calls.append(a))
    assert sorted(st.skipped) == sorted(set(sd) - {"a.weight", "ids"})
    want = sd["a.weight"].numel() * 4 + sd["ids"].numel() * 8
    assert calls[-1] == (want, want, 2, 2), calls


def test_two_argument_callback_gets_bytes(checkpoint):
    path, sd = checkpoint
    calls = []

    def bytes_only(done, total):
        calls.append((done, total))
    load(path, progress=bytes_only)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    assert calls[-1] == (total, total)


def test_callback_failure_fails_the_load_cleanly(checkpoint):
    path, _ = checkpoint

    def boom(*a):
        raise RuntimeError("stop here")
    with shardload.Context(backend="cpu") as ctx:
        src, plan = ctx.open(path), ctx.plan()
        with pytest.raises(shardload.ShardloadError, match="stop here") as e:
            ctx.load(plan, src, progress=boom)
        assert isinstance(e.value.__cause__, RuntimeError)
        assert e.value.status is shardload.Status.ERR_INVALID
        assert len(ctx.load(plan, src)) == 6  # the context stays usable
    with pytest.raises(TypeError, match="callable"):
        load(path, progress=42)


def test_bar_forced_on_and_off(checkpoint, capfd, monkeypatch, caplog):
    pytest.importorskip("tqdm")
    path, sd = checkpoint
    load(path, progress_bar=True)
    err = capfd.readouterr().err
    assert "shardload" in err and "B/s" in err and f"{len(sd)}/{len(sd)} tensors" in err, err
    monkeypatch.setenv("SHARDLOAD_PROGRESS", "1")
    load(path)
    assert "B/s" in capfd.readouterr().err
    load(path, progress_bar=False)  # the argument wins over the environment
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("SHARDLOAD_PROGRESS", "0")
    load(path)
    assert capfd.readouterr().err == ""
    monkeypatch.delenv("SHARDLOAD_PROGRESS")
    load(path)  # stderr is not a terminal here: no bar by default
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("SHARDLOAD_PROGRESS", "sometimes")  # read on one rank alone: warns, no bar
    with caplog.at_level(logging.WARNING, logger="shardload"):
        assert len(load(path)) == len(sd)
    assert "SHARDLOAD_PROGRESS='sometimes'" in caplog.text and capfd.readouterr().err == ""
    with pytest.raises(TypeError, match="progress_bar"):
        load(path, progress_bar="yes")


def test_bar_without_tqdm_warns_and_loads(checkpoint, monkeypatch, caplog):
    path, _ = checkpoint
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    st = load(path, progress_bar=True)
    assert len(st) == 6 and "tqdm is not installed" in caplog.text


def test_bar_that_fails_to_start_warns_and_loads(checkpoint, monkeypatch, caplog):
    tqdm = pytest.importorskip("tqdm")
    path, sd = checkpoint

    def broken(*a, **kw):
        raise OSError("no terminal after all")
    monkeypatch.setattr(tqdm, "tqdm", broken)
    st = load(path, progress_bar=True)
    assert len(st) == len(sd) and "progress bar off: no terminal after all" in caplog.text


def _run_in_terminal(code: str, env: dict) -> str:
    """CODE in a python whose stderr (and stdout) is a pseudo-terminal; what it wrote there."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size
    p = subprocess.Popen([sys.executable, "-c", code], stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    out = b""
    while True:
        ready, _, _ = select.select([primary], [], [], 60)
        if not ready:
            p.kill()
            raise AssertionError(f"no output from the terminal child; so far {out!r}")
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(primary)
    assert p.wait(60) == 0, out
    return out.decode(errors="replace")


@pytest.mark.parametrize("setting", [None, "0"])
def test_bar_by_default_in_a_terminal(checkpoint, setting):
    pytest.importorskip("tqdm")
    path, sd = checkpoint
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("SHARDLOAD_PROGRESS", None)
    if setting is not None:
        env["SHARDLOAD_PROGRESS"] = setting
    code = ("import sys, shardload\n"
            "assert sys.stderr.isatty()\n"
            "with shardload.Context(backend='cpu') as ctx:\n"
            f"    st = ctx.load(ctx.plan(), ctx.open({path!r}))\n"
            "print('loaded', len(st))\n")
    out = _run_in_terminal(code, env)
    assert f"loaded {len(sd)}" in out
    if setting is None:
        assert "B/s" in out and f"{len(sd)}/{len(sd)} tensors" in out, out
    else:
        assert "B/s" not in out and "tensors" not in out, out
