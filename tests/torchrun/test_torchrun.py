#!/usr/bin/env python3
"""shardload under the real torchrun, and as a client of torch's c10d TCPStore.

torchrun's agent serves a c10d TCPStore on MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=
True), so the ranks must be its clients (rendezvous c10d://HOST:PORT) rather than serve a store of
their own on the same port. Scenarios (one per CTest test, --scenario NAME):

  world2, world4          `torchrun --standalone --nproc-per-node N --no-python shardload load ...`
                          exits 0 and every rank's --dump is byte-identical to a --nproc N run's.
  twice                   two loads back to back in the same workers, on the same agent store
                          (the second must not meet the first's keys).
  restart                 rank 1 fails in attempt 0; with --max-restarts 1 attempt 1 loads (the
                          agent's store still holds attempt 0's keys).
  static                  explicit --master-addr/--master-port with --rdzv-backend static.
  kill                    a rank SIGKILLed while the data moves: torchrun exits non-zero well
                          within the timeout, no rank process is left, and a surviving rank's
                          error (if it printed one) names the lost rank.
  c10d-servers            ranks started by hand against a torch.distributed.TCPStore server, with
                          the libuv server and the classic one; dumps as above.
  c10d-kill               a rank SIGKILLed mid-load with no agent to stop the others: each
                          surviving rank fails well within the timeout naming the lost rank.
  c10d-errors             a server that is not a c10d store is named with what to check; a rank
                          number started twice fails every rank with a message naming it.
  c10d-missing            ranks 0 and 1 of a world of 4096 (the largest) against both of torch's
                          servers, the others never started: each fails within about its
                          timeout naming the lowest missing ranks and how many (a count from one
                          ADD, not a CHECK per rank); a world of 4097 is refused at once.

Exits 77 (skipped) when torch is not importable, unless SHARDLOAD_REQUIRE_TORCH=1 (CI), where that
is a failure.

    python3 tests/torchrun/test_torchrun.py --bin build/shardload --tmp /tmp/tr --scenario world2
"""
import argparse
import datetime
import filecmp
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

try:
    import torch  # noqa: F401
    import torch.distributed as dist
except Exception as e:  # any import failure: torch absent or broken
    print(f"skipped: torch not importable ({e})")
    if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1":
        print("FAIL: SHARDLOAD_REQUIRE_TORCH=1 but torch is missing; install it (scripts/deps.sh --python)")
        sys.exit(1)
    sys.exit(77)

TIMEOUT_S = 60  # the load's --timeout; every wait here is bounded by a multiple of it


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def torchrun_cmd():
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]


def clean_env():
    """The environment of a fresh launch: no launcher or rendezvous variables of our own caller."""
    env = dict(os.environ)
    for k in list(env):
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") or \
                k.startswith(("TORCHELASTIC_", "SHARDLOAD_RENDEZVOUS", "SLURM_", "OMPI_")):
            del env[k]
    return env


def run(cmd, limit, env=None):
    """Runs CMD in its own session; kills the whole session at LIMIT seconds. Returns (rc, output)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env or clean_env(), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        fail(f"{' '.join(cmd)} still running after {limit} s:\n{out[-4000:]}")
    return p.returncode, out


def synth(bin_, tmp, name, size):
    path = os.path.join(tmp, name)
    if not os.path.isdir(path):
        rc, out = run([bin_, "synth", path, "--size", size, "--shards", "2"], 300)
        if rc != 0:
            fail(f"synth {path}: {out}")
    return path


def reference_dump(bin_, tmp, ckpt, world):
    """What a --nproc run lands on each rank: the expected dump."""
    d = os.path.join(tmp, f"ref-{os.path.basename(ckpt)}-{world}")
    if not os.path.isdir(d):
        rc, out = run([bin_, "load", ckpt, "--nproc", str(world), "--timeout", str(TIMEOUT_S), "--dump", d],
                      TIMEOUT_S * 2)
        if rc != 0:
            fail(f"reference --nproc {world} load failed:\n{out[-4000:]}")
    return d


def same_dumps(ref, got, world, what):
    for r in range(world):
        a, b = os.path.join(ref, f"rank-{r}.safetensors"), os.path.join(got, f"rank-{r}.safetensors")
        if not os.path.isfile(b):
            fail(f"{what}: rank {r} wrote no dump ({b})")
        if not filecmp.cmp(a, b, shallow=False):
            fail(f"{what}: rank {r}'s dump differs from the --nproc run's ({a} vs {b})")
    print(f"ok: {what}: {world} dumps identical to the --nproc run's")


def fresh(tmp, name):
    d = os.path.join(tmp, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_args(bin_, ckpt, dump):
    return [bin_, "load", ckpt, "--timeout", str(TIMEOUT_S), "--dump", dump]


# ---- scenarios under torchrun ---------------------------------------------------------------

def torchrun_world(a, world):
    ckpt = synth(a.bin, a.tmp, "ck-small", "48MiB")
    ref = reference_dump(a.bin, a.tmp, ckpt, world)
    dump = fresh(a.tmp, f"tr-{world}")
    cmd = torchrun_cmd() + ["--standalone", "--nproc-per-node", str(world), "--no-python"] + \
        load_args(a.bin, ckpt, dump)
    t0 = time.monotonic()
    rc, out = run(cmd, TIMEOUT_S * 2)
    if rc != 0:
        fail(f"torchrun world {world} exited {rc}:\n{out[-4000:]}")
    if "Address already in use" in out:
        fail(f"a rank tried to serve the agent's port:\n{out[-4000:]}")
    same_dumps(ref, dump, world, f"torchrun --standalone world {world} ({time.monotonic() - t0:.1f} s)")


def torchrun_static(a):
    ckpt = synth(a.bin, a.tmp, "ck-small", "48MiB")
    ref = reference_dump(a.bin, a.tmp, ckpt, 2)
    dump = fresh(a.tmp, "tr-static")
    cmd = torchrun_cmd() + ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "static",
                            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                            "--no-python"] + load_args(a.bin, ckpt, dump)
    rc, out = run(cmd, TIMEOUT_S * 2)
    if rc != 0:
        fail(f"torchrun --rdzv-backend static exited {rc}:\n{out[-4000:]}")
    same_dumps(ref, dump, 2, "torchrun --rdzv-backend static --master-addr 127.0.0.1")


def torchrun_twice(a):
    """Two runs in the same workers: same agent store, same run id and restart count."""
    ckpt = synth(a.bin, a.tmp, "ck-small", "48MiB")
    ref = reference_dump(a.bin, a.tmp, ckpt, 2)
    d1, d2 = fresh(a.tmp, "tr-twice-1"), fresh(a.tmp, "tr-twice-2")
    script = '"$0" load "$1" --timeout "$2" --dump "$3" && "$0" load "$1" --timeout "$2" --dump "$4"'
    cmd = torchrun_cmd() + ["--standalone", "--nproc-per-node", "2", "--no-python", "bash", "-c", script,
                            a.bin, ckpt, str(TIMEOUT_S), d1, d2]
    rc, out = run(cmd, TIMEOUT_S * 3)
    if rc != 0:
        fail(f"two loads on one agent store: torchrun exited {rc}:\n{out[-4000:]}")
    same_dumps(ref, d1, 2, "first of two runs on one agent store")
    same_dumps(ref, d2, 2, "second of two runs on one agent store")


def torchrun_restart(a):
    """A worker restart: the agent's store keeps attempt 0's keys; attempt 1 must not meet them."""
    ckpt = synth(a.bin, a.tmp, "ck-small", "48MiB")
    ref = reference_dump(a.bin, a.tmp, ckpt, 2)
    dump = fresh(a.tmp, "tr-restart")
    # Attempt 0: rank 1 fails after rank 0 has entered the rendezvous; the agent stops rank 0
    # and starts both again (TORCHELASTIC_RESTART_COUNT=1).
    script = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then sleep 2; exit 3; fi; '
              'exec "$0" load "$1" --timeout "$2" --dump "$3"')
    cmd = torchrun_cmd() + ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--no-python",
                            "bash", "-c", script, a.bin, ckpt, str(TIMEOUT_S), dump]
    rc, out = run(cmd, TIMEOUT_S * 3)
    if rc != 0:
        fail(f"a restarted job: torchrun exited {rc}:\n{out[-4000:]}")
    if "exitcode  : 3" not in out and "exitcode: 3" not in out and "exit code 3" not in out.lower():
        print("note: torchrun's output does not show attempt 0's failure:\n" + out[-2000:])
    same_dumps(ref, dump, 2, "attempt 1 after a worker restart on the same agent store")


def rank_procs(marker):
    """{rank: pid} of the live shardload processes whose command line holds MARKER."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state == "Z" or not argv[0].endswith(b"shardload") or marker.encode() not in b" ".join(argv):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            found[int(env.get(b"RANK", b"-1"))] = int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return found


def read_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            return int(next(l for l in f if l.startswith("rchar:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return -1


def torchrun_kill(a):
    world, victim = 4, 2
    # Big enough that the data phase lasts a few seconds on a loaded 2-core machine.
    ckpt = synth(a.bin, a.tmp, "ck-kill", "768MiB")
    dump = fresh(a.tmp, "tr-kill")
    cmd = torchrun_cmd() + ["--standalone", "--nproc-per-node", str(world), "--no-python"] + \
        load_args(a.bin, ckpt, dump)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(),
                         start_new_session=True)
    killed_at = None
    try:
        # Rank 0 reads the checkpoint only once the ranks have met and the data moves; kill the
        # victim as soon as rank 0 has read 16 MiB.
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and p.poll() is None:
            procs = rank_procs(dump)
            if 0 in procs and victim in procs and read_bytes(procs[0]) > (16 << 20):
                os.kill(procs[victim], signal.SIGKILL)
                killed_at = time.monotonic()
                break
            time.sleep(0.01)
        if killed_at is None:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            fail(f"never saw the load in its data phase (torchrun exited {p.returncode}):\n{out[-4000:]}")
        # Well below the timeout: torchrun sees the dead worker and stops the others.
        out, _ = p.communicate(timeout=TIMEOUT_S / 2)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        fail(f"torchrun still running {TIMEOUT_S / 2} s after rank {victim} was killed:\n{out[-4000:]}")
    took = time.monotonic() - killed_at
    if p.returncode == 0:
        fail(f"torchrun exited 0 although rank {victim} was killed mid-load:\n{out[-4000:]}")
    # torchrun has exited: nothing of the job may remain.
    left = {}
    for _ in range(100):
        left = rank_procs(dump)
        if not left:
            break
        time.sleep(0.05)
    if left:
        for pid in left.values():
            os.kill(pid, signal.SIGKILL)
        fail(f"rank processes left behind after torchrun exited: {left}")
    errors = [l for l in out.splitlines() if l.startswith("shardload:") or "]:shardload:" in l]
    for l in errors:  # torchrun usually stops the survivors before they report
        about_peer = any(w in l for w in ("SL_ERR_PEER", "SL_ERR_TIMEOUT", "lost", "stopped responding"))
        if about_peer and f"rank {victim}" not in l:
            fail(f"a surviving rank's error does not name the killed rank {victim}: {l}")
    if f"rank: {victim}" not in out and f"rank {victim}" not in out:
        fail(f"neither torchrun nor a rank named the killed rank {victim}:\n{out[-4000:]}")
    print(f"ok: rank {victim} of {world} killed mid-load: torchrun exited {p.returncode} {took:.1f} s later "
          f"(timeout {TIMEOUT_S} s), no process left; {len(errors)} rank error line(s)")
    for l in errors:
        print("    " + l)


# ---- scenarios against a torch TCPStore server ----------------------------------------------

def start_ranks(bin_, ckpt, dump, url, ranks, world, extra_env=None, timeout_s=TIMEOUT_S):
    procs = []
    for r in ranks:
        env = clean_env()
        env.update(extra_env or {})
        # The environment's rendezvous, as a launcher would give it (explicit ranks without
        # --rendezvous take it from there).
        env["SHARDLOAD_RENDEZVOUS"] = url
        procs.append(subprocess.Popen(
            [bin_, "load", ckpt, "--rank", str(r), "--world-size", str(world),
             "--timeout", str(timeout_s), "--dump", dump],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True))
    return procs


def stacks_of(pid):
    """Every thread's stack of a hung rank, where gdb is installed (CI's machine has it)."""
    gdb = shutil.which("gdb")
    if not gdb:
        return "(no gdb here)"
    try:
        r = subprocess.run([gdb, "-batch", "-nx", "-p", str(pid), "-ex", "thread apply all bt 30"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        lines = [l for l in r.stdout.splitlines() if l.startswith(("#", "Thread"))]
        return "\n".join(lines)[-6000:] or r.stdout[-2000:]
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(gdb: {e})"


def finish(procs, limit):
    outs = []
    deadline = time.monotonic() + limit
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            running = [q.pid for q in procs if q.poll() is None]
            stacks = [f"--- stacks of pid {pid}:\n{stacks_of(pid)}" for pid in running]
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            # what every rank printed, so that a hang in CI says where each rank was
            said = []
            for i, q in enumerate(procs):
                if i < len(outs):
                    out = outs[i][1] or ""
                else:
                    try:
                        out = q.communicate(timeout=10)[0] or ""
                    except subprocess.TimeoutExpired:
                        out = "(no output)"
                said.append(f"--- process {i} (pid {q.pid}, exit {q.returncode}):\n{out[-2000:]}")
            fail(f"a rank still ran after {limit} s (pids {running}):\n" + "\n".join(said + stacks))
        outs.append((p.returncode, out))
    return outs


def c10d_servers(a):
    ckpt = synth(a.bin, a.tmp, "ck-small", "48MiB")
    ref = reference_dump(a.bin, a.tmp, ckpt, 2)
    for libuv in (True, False):
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=TIMEOUT_S), use_libuv=libuv)
        name = "libuv" if libuv else "classic"
        if store.libuvBackend != libuv:
            fail(f"torch gave the {'libuv' if store.libuvBackend else 'classic'} server when asked for {name}")
        url = f"c10d://127.0.0.1:{store.port}"
        for run_no in (1, 2):  # the second run meets the first's keys in the same store
            dump = fresh(a.tmp, f"c10d-{name}-{run_no}")
            outs = finish(start_ranks(a.bin, ckpt, dump, url, [0, 1], 2), TIMEOUT_S * 2)
            for r, (rc, out) in enumerate(outs):
                if rc != 0:
                    fail(f"{name} server, run {run_no}: rank {r} exited {rc}:\n{out[-3000:]}")
            same_dumps(ref, dump, 2, f"torch {name} TCPStore at {url}, run {run_no}")
        del store


def c10d_kill(a):
    """A rank killed mid-load with no agent to stop the others: they name it, through the store."""
    world, victim = 3, 2
    ckpt = synth(a.bin, a.tmp, "ck-kill", "768MiB")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=TIMEOUT_S))
    procs = start_ranks(a.bin, ckpt, fresh(a.tmp, "c10d-kill"), f"c10d://127.0.0.1:{store.port}",
                        range(world), world)
    deadline = time.monotonic() + TIMEOUT_S
    while read_bytes(procs[0].pid) <= (16 << 20):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            fail("never saw the load in its data phase: " + repr([p.communicate()[0][-2000:] for p in procs]))
        time.sleep(0.01)
    os.kill(procs[victim].pid, signal.SIGKILL)
    t0 = time.monotonic()
    outs = finish([p for r, p in enumerate(procs) if r != victim], TIMEOUT_S)
    took = time.monotonic() - t0
    for r, (rc, out) in zip([r for r in range(world) if r != victim], outs):
        if rc != 1 or f"lost rank {victim}" not in out:
            fail(f"rank {r}: expected exit 1 naming the lost rank {victim}, got {rc}:\n{out[-3000:]}")
    finish([procs[victim]], 5)
    if took > TIMEOUT_S / 2:
        fail(f"the surviving ranks took {took:.1f} s to fail (timeout {TIMEOUT_S} s)")
    print(f"ok: rank {victim} of {world} killed mid-load: the others failed in {took:.1f} s: "
          f"{outs[0][1].strip().splitlines()[-1]}")
    del store


def c10d_errors(a):
    ckpt = synth(a.bin, a.tmp, "ck-small", "48MiB")
    # Not a c10d store: a server that closes at once, and one that answers garbage.
    for mode in ("close", "garbage"):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        procs = start_ranks(a.bin, ckpt, fresh(a.tmp, "c10d-bad"), f"c10d://127.0.0.1:{port}", [1], 2)
        srv.settimeout(TIMEOUT_S)
        conn, _ = srv.accept()
        if mode == "garbage":
            conn.settimeout(TIMEOUT_S)
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()
        t0 = time.monotonic()
        (rc, out), = finish(procs, TIMEOUT_S)
        srv.close()
        took = time.monotonic() - t0
        if rc != 1 or f"127.0.0.1:{port}" not in out or "c10d" not in out or "MASTER_ADDR:MASTER_PORT" not in out:
            fail(f"a {mode} server: expected exit 1 naming 127.0.0.1:{port} and what to check, got {rc}:\n{out}")
        if took > TIMEOUT_S / 2:
            fail(f"a {mode} server: took {took:.1f} s to fail")
        print(f"ok: not a c10d store ({mode}): {out.strip().splitlines()[-1]}")

    # Rank 1 started twice: the second to claim it fails, and so do the ranks still meeting.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=TIMEOUT_S))
    url = f"c10d://127.0.0.1:{store.port}"
    dump = fresh(a.tmp, "c10d-dup")
    env = {"SHARDLOAD_JOB_ID": "dup-test"}  # the same job, as a launcher would say
    first = start_ranks(a.bin, ckpt, dump, url, [0, 1], 3, env)  # rank 2 never comes
    time.sleep(1.0)  # let them claim their ranks and wait for rank 2
    second = start_ranks(a.bin, ckpt, dump, url, [1], 3, env)
    t0 = time.monotonic()
    outs = finish(second + first, TIMEOUT_S * 2)
    took = time.monotonic() - t0
    for (rc, out), who in zip(outs, ("the second rank 1", "rank 0", "the first rank 1")):
        if rc == 0 or "rank 1 was started twice" not in out:
            fail(f"{who}: expected failure naming the duplicated rank 1, got exit {rc}:\n{out}")
    if took > TIMEOUT_S / 2:
        fail(f"duplicate rank: the ranks took {took:.1f} s to fail (timeout {TIMEOUT_S} s)")
    print(f"ok: duplicate rank 1: every rank failed in {took:.1f} s: {outs[0][1].strip().splitlines()[-1]}")
    del store


def c10d_missing(a):
    """The largest world with two ranks started: a bounded report, within about the timeout."""
    ckpt = synth(a.bin, a.tmp, "ck-small", "48MiB")
    timeout_s, world = 5, 4096
    for libuv in (True, False):
        name = "libuv" if libuv else "classic"
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=TIMEOUT_S), use_libuv=libuv)
        url = f"c10d://127.0.0.1:{store.port}"
        t0 = time.monotonic()
        outs = finish(start_ranks(a.bin, ckpt, fresh(a.tmp, "c10d-missing"), url, [0, 1], world,
                                  timeout_s=timeout_s), TIMEOUT_S)
        took = time.monotonic() - t0
        want = "waiting for ranks 2, 3, 4, 5, 6, 7, 8, 9 and 4086 more to join"
        for r, (rc, out) in enumerate(outs):
            if rc != 1 or want not in out or "SL_ERR_TIMEOUT" not in out:
                fail(f"{name} server: rank {r}: expected exit 1 with SL_ERR_TIMEOUT and '{want}', got {rc}:\n{out}")
        if took > 1.6 * timeout_s + 2:  # the ranks' own start-up besides
            fail(f"{name} server: the ranks took {took:.1f} s to fail (timeout {timeout_s} s)")
        print(f"ok: {name} server, 2 of {world} ranks: failed in {took:.1f} s: {outs[0][1].strip().splitlines()[-1]}")
        del store
    (rc, out), = finish(start_ranks(a.bin, ckpt, fresh(a.tmp, "c10d-missing"), "c10d://127.0.0.1:1", [0],
                                    world + 1), 10)
    if rc != 2 or "--world-size" not in out or "4096" not in out:
        fail(f"a world of {world + 1}: expected a usage error naming --world-size and 4096, got {rc}:\n{out}")
    print(f"ok: a world of {world + 1} refused: {out.strip().splitlines()[-1]}")


SCENARIOS = {
    "world2": lambda a: torchrun_world(a, 2),
    "world4": lambda a: torchrun_world(a, 4),
    "static": torchrun_static,
    "twice": torchrun_twice,
    "restart": torchrun_restart,
    "kill": torchrun_kill,
    "c10d-servers": c10d_servers,
    "c10d-kill": c10d_kill,
    "c10d-errors": c10d_errors,
    "c10d-missing": c10d_missing,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="the shardload CLI")
    ap.add_argument("--tmp", required=True,
                    help="scratch directory: removed when the scenario passes (its checkpoints reach "
                         "768 MiB), kept for a look when it fails or SHARDLOAD_KEEP_TEST_TMP=1")
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    os.makedirs(a.tmp, exist_ok=True)
    SCENARIOS[a.scenario](a)
    # Passed (a failure exits through fail()): its checkpoints and dumps go, so that the suite's
    # disk use stays that of the few scenarios running at once, not the sum of all of them.
    if os.environ.get("SHARDLOAD_KEEP_TEST_TMP") != "1":
        shutil.rmtree(a.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
