#!/usr/bin/env python3
"""Multi-host tests over real network interfaces, hosts made of Linux network namespaces.

    multihost.py --bin SHARDLOAD --tmp DIR [--case NAME]... [--slow F] [--list]

Each "host" is a network namespace with one veth interface (eth0, 198.51.100.<1+i>/24, TEST-NET-2)
whose peer is a port of a bridge in a "switch" namespace of its own; nothing is attached to the
machine's own network and no namespace has a route out of 198.51.100.0/24. Every rank is a real
`shardload load` process started with `ip netns exec HOST` and launcher variables (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), a `tcp://198.51.100.1:PORT` rendezvous with the job's
secret (SHARDLOAD_TOKEN) and Gloo told its interface (SHARDLOAD_GLOO_IFNAME=eth0). The checkpoint
is a directory every host sees, or, for the ranks of a host that does not read it (rank-0 mode,
hosts other than rank 0's), hidden under an empty tmpfs in a mount namespace of their own.

Loads are compared byte for byte (--dump) with the same load on one host over loopback
(--nproc). Faults (tc tbf, ip link, nftables on the bridge, SIGKILL, an unreachable store) assert
that every rank exits non-zero within a stated bound, names a rank of the host it lost, and that
no process is left in any of the namespaces. The namespaces are removed on every exit (and
leftovers of an earlier run whose process is gone, at the start).

Exit status 0 when every case passed, 1 when one failed, 77 (skipped, with the reason) where
namespaces, veth pairs, a bridge, tbf or nftables cannot be made here (not root, tools missing).
Standard library only.
"""
import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import traceback

SKIP = 77
PREFIX = "slmh"                 # namespaces: slmh-<pid>-sw, slmh-<pid>-h<i>
NET = "198.51.100"              # TEST-NET-2 (RFC 5737): never routed anywhere
IFNAME = "eth0"                 # every host's interface, inside its namespace
RANKS_PER_HOST = 2
LAUNCH_VARS = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|"
                         r"SLURM_.*|OMPI_.*|PMI_.*|TORCHELASTIC_.*|SHARDLOAD_.*)$")
# how a rank is named in an error (collectives/gloo/gloo.cc:rank_list, the rendezvous's report,
# hier's and shm's labels): "rank 3", "ranks 2, 3", "ranks 2, 3 and 5 more"
RANK_WORDS = re.compile(r"\branks? (\d+(?:, \d+)*)")


def log(*a):
    print("multihost:", *a, flush=True)


def run(cmd, check=True, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def named_ranks(text):
    out = set()
    for m in RANK_WORDS.finditer(text):
        out.update(int(x) for x in m.group(1).split(", "))
    return out


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return os.path.getsize(path), h.hexdigest()


class Failure(Exception):
    pass


def check(cond, what):
    """Fails the case with WHAT (a string, or a function giving one) unless COND."""
    if not cond:
        raise Failure(what() if callable(what) else what)


# ---- the network --------------------------------------------------------------------------

def ns_pids(ns):
    r = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def remove_ns(ns):
    """Kills whatever still runs in NS (a namespace outlives its name while a process holds
    it), then removes it."""
    for _ in range(50):
        pids = ns_pids(ns)
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    run(["ip", "netns", "del", ns], check=False)


def harness_alive(pid):
    """Whether PID is a live run of this harness (not a zombie, not a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return state != "Z" and b"multihost" in cmd


def remove_leftovers():
    """Namespaces of earlier runs of this harness whose process is gone (a run killed with
    SIGKILL cannot clean up after itself), and what still runs in them."""
    r = run(["ip", "netns", "list"], check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{PREFIX}-(\d+)-", name)
        if m and int(m.group(1)) != os.getpid() and not harness_alive(int(m.group(1))):
            log(f"removing leftover namespace {name} (run {m.group(1)} is gone)")
            remove_ns(name)


class Net:
    """A switch namespace with a bridge, and N host namespaces each with one veth to it."""

    def __init__(self, nhosts):
        pid = os.getpid()
        self.sw = f"{PREFIX}-{pid}-sw"
        self.hosts = [f"{PREFIX}-{pid}-h{i}" for i in range(nhosts)]
        self.made = []

    def addr(self, h):
        return f"{NET}.{1 + h}"

    def port(self, h):     # the switch's end of host h's link
        return f"p{h}"

    def up(self):
        def add(ns):
            run(["ip", "netns", "add", ns])
            self.made.append(ns)
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # no IPv6: no router solicitations or DAD on the links, only the test's traffic
            run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1"], check=False)
        add(self.sw)
        run(["ip", "-n", self.sw, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        run(["ip", "-n", self.sw, "link", "set", "br0", "up"])
        for h, ns in enumerate(self.hosts):
            add(ns)
            run(["ip", "link", "add", IFNAME, "netns", ns, "type", "veth", "peer", "name", self.port(h),
                 "netns", self.sw])
            run(["ip", "-n", self.sw, "link", "set", self.port(h), "master", "br0"])
            run(["ip", "-n", self.sw, "link", "set", self.port(h), "up"])
            run(["ip", "-n", ns, "addr", "add", f"{self.addr(h)}/24", "dev", IFNAME])
            run(["ip", "-n", ns, "link", "set", IFNAME, "up"])
        for ns in self.hosts:   # no default route: nothing leaves 198.51.100.0/24
            r = run(["ip", "-n", ns, "route", "show", "default"])
            check(r.stdout.strip() == "", f"{ns} has a default route: {r.stdout.strip()}")

    def down(self):
        for ns in reversed(self.made):
            remove_ns(ns)
        self.made = []

    def rx_bytes(self, h):
        """Bytes host h's interface received."""
        r = run(["ip", "-n", self.hosts[h], "-s", "-j", "link", "show", "dev", IFNAME])
        return json.loads(r.stdout)[0]["stats64"]["rx"]["bytes"]

    def limit(self, h, rate):
        """A tbf rate limit on both ends of host h's link (each end's egress)."""
        for ns, dev in ((self.hosts[h], IFNAME), (self.sw, self.port(h))):
            run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", "64kb", "latency", "50ms"])

    def unlimit(self, h):
        for ns, dev in ((self.hosts[h], IFNAME), (self.sw, self.port(h))):
            run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)

    def link(self, h, state):
        run(["ip", "-n", self.sw, "link", "set", self.port(h), state])

    def partition(self, h):
        """Drops every frame to or from host h on the bridge (nftables, bridge family)."""
        rules = (f"table bridge slmh {{ chain slmh_fwd {{ type filter hook forward priority 0; policy accept; "
                 f"iifname \"{self.port(h)}\" drop; oifname \"{self.port(h)}\" drop; }}\n}}\n")
        run(["ip", "netns", "exec", self.sw, "nft", "-f", "-"], input=rules)

    def heal(self):
        run(["ip", "netns", "exec", self.sw, "nft", "delete", "table", "bridge", "slmh"], check=False)

    def drop_port(self, h, port):
        """Host h drops TCP to PORT from other hosts (its store unreachable, its host alive)."""
        rules = (f"table inet slmh {{ chain slmh_in {{ type filter hook input priority 0; policy accept; "
                 f"iifname \"{IFNAME}\" tcp dport {port} drop; }}\n}}\n")
        run(["ip", "netns", "exec", self.hosts[h], "nft", "-f", "-"], input=rules)

    def undrop_port(self, h):
        run(["ip", "netns", "exec", self.hosts[h], "nft", "delete", "table", "inet", "slmh"], check=False)

    def reset(self):
        """After a case, whatever it left (a failed case may leave ranks running or a fault in
        place): kills every process in the hosts, lifts every fault. Returns what it killed."""
        killed = []
        for ns in self.hosts:
            for p in ns_pids(ns):
                try:
                    os.kill(p, signal.SIGKILL)
                    killed.append(p)
                except ProcessLookupError:
                    pass
        self.heal()
        for h in range(len(self.hosts)):
            self.unlimit(h)
            self.undrop_port(h)
            self.link(h, "up")
        # a fault leaves ARP entries behind: one whose last probe went out while the link was
        # down fails after the case, and the next case's connects queued on it fail with it (the
        # likely cause of partition_gloo_4x2 ending before its fault in a clean-clone CI: host
        # 3's ranks "No route to host" at 0.47 s, after a case that took host 3's link down), so
        # every host forgets its neighbours between cases
        for ns in self.hosts:
            run(["ip", "-n", ns, "neigh", "flush", "all"], check=False)
        return killed


def capabilities():
    """None when namespaces, veth, a bridge, tbf and nftables (bridge and inet) can be made
    here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
    for tool in ("ip", "tc", "nft", "unshare", "mount"):
        if not shutil.which(tool):
            return f"'{tool}' not found (Debian: iproute2, nftables, util-linux, mount)"
    net = Net(1)
    net.sw, net.hosts = net.sw + "probe", [net.hosts[0] + "probe"]
    try:
        net.up()
        net.limit(0, "100mbit")
        net.partition(0)
        net.drop_port(0, 1)
        run(["ip", "netns", "exec", net.hosts[0], "unshare", "--mount", "true"])
    except (RuntimeError, Failure, OSError) as e:
        return f"cannot make a namespace host here: {e}"
    finally:
        net.down()
    return None


# ---- jobs ---------------------------------------------------------------------------------

class Rank:
    def __init__(self, rank, host, proc, out, err):
        self.rank, self.host, self.proc, self.out, self.err = rank, host, proc, out, err
        self.rc = None
        self.end = None
        self.said = None    # when its stderr was first written (its error, for a failing rank)

    def report(self):
        try:
            with open(self.out) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def stderr(self):
        try:
            with open(self.err, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


class Job:
    """One job of HOSTS x RANKS_PER_HOST explicit ranks, rank r on host r // RANKS_PER_HOST."""
    counter = 0

    def __init__(self, t, net, nhosts, args, timeout, per_host=RANKS_PER_HOST, hidden=(), rdzv_host=None,
                 dump=True, name="job"):
        Job.counter += 1
        self.t, self.net, self.nhosts, self.per_host = t, net, nhosts, per_host
        self.world = nhosts * per_host
        self.port = 29400 + Job.counter
        self.rdzv = f"tcp://{rdzv_host or net.addr(0)}:{self.port}"
        self.timeout = timeout
        self.dir = os.path.join(t.tmp, f"{Job.counter:02d}-{name}")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.dump = os.path.join(self.dir, "dump") if dump else None
        if self.dump:
            os.makedirs(self.dump)
        self.args, self.hidden = args, set(hidden)
        self.ranks = []
        self.secret = secrets.token_hex(32)

    def host_of(self, r):
        return r // self.per_host

    def start(self):
        base = {k: v for k, v in os.environ.items() if not LAUNCH_VARS.match(k)}
        base.update({"WORLD_SIZE": str(self.world), "LOCAL_WORLD_SIZE": str(self.per_host),
                     "SHARDLOAD_RENDEZVOUS": self.rdzv, "SHARDLOAD_TOKEN": self.secret,
                     "SHARDLOAD_GLOO_IFNAME": IFNAME, "SHARDLOAD_JOB_ID": f"multihost-{os.getpid()}-{Job.counter}"})
        self.t0 = time.monotonic()
        for r in range(self.world):
            h = self.host_of(r)
            env = dict(base, RANK=str(r), LOCAL_RANK=str(r % self.per_host))
            cmd = [self.t.bin, "load", self.t.ckpt, "--backend", "cpu", "--timeout", str(self.timeout), "--json"]
            if self.dump:
                cmd += ["--dump", self.dump]
            cmd += self.args
            if h in self.hidden:
                # a mount namespace of its own, the checkpoint's directory under an empty tmpfs
                # (checked empty), then exec: the process started is the rank itself
                env["SL_MH_HIDE"] = self.t.ckpt
                cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       'mount -t tmpfs -o size=64k,mode=0755 slmh-hidden "$SL_MH_HIDE" && '
                       '[ -z "$(ls -A "$SL_MH_HIDE")" ] || exit 99; unset SL_MH_HIDE; exec "$@"', "sh"] + cmd
            out = os.path.join(self.dir, f"rank-{r}.json")
            err = os.path.join(self.dir, f"rank-{r}.stderr")
            with open(out, "w") as fo, open(err, "w") as fe:
                p = subprocess.Popen(["ip", "netns", "exec", self.net.hosts[h]] + cmd, env=env, stdout=fo,
                                     stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True)
            self.ranks.append(Rank(r, h, p, out, err))

    def poll(self):
        now = time.monotonic()
        for k in self.ranks:
            if k.said is None and os.path.getsize(k.err) > 0:
                k.said = now - self.t0
            if k.rc is None and k.proc.poll() is not None:
                k.rc, k.end = k.proc.returncode, now - self.t0
                if k.said is None and os.path.getsize(k.err) > 0:
                    k.said = k.end
        return all(k.rc is not None for k in self.ranks)

    def wait(self, limit):
        """Waits until every rank has exited, at most LIMIT seconds from the start; past it
        kills what is left (each rank's process group) and fails."""
        while not self.poll():
            if time.monotonic() - self.t0 > limit:
                hung = [k.rank for k in self.ranks if k.rc is None]
                self.kill_all()
                raise Failure(f"ranks {hung} still running {limit:.0f} s after the start (timeout "
                              f"{self.timeout} s): killed")
            time.sleep(0.01)
        self.check_nothing_left()
        for k in self.ranks:   # a sanitizer build's report fails the case whatever the exit status
            err = k.stderr()
            check(not re.search(r"ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error: ", err),
                  lambda: f"rank {k.rank}: a sanitizer report: {err.strip()[-3000:]}")

    def kill_all(self):
        for k in self.ranks:
            if k.proc.poll() is None:
                try:
                    os.killpg(k.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for k in self.ranks:
            k.proc.wait()
        self.poll()

    def check_nothing_left(self):
        """No process in any of the namespaces, no process group of a rank alive."""
        deadline = time.monotonic() + 2
        while True:
            left = {ns: ns_pids(ns) for ns in self.net.hosts}
            left = {ns: p for ns, p in left.items() if p}
            groups = []
            for k in self.ranks:
                try:
                    os.killpg(k.proc.pid, 0)
                    groups.append(k.rank)
                except ProcessLookupError:
                    pass
            if not left and not groups:
                return
            if time.monotonic() > deadline:
                for ps in left.values():
                    for p in ps:
                        try:
                            os.kill(p, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                raise Failure(f"left running after the job: processes {left}, process groups of ranks {groups}")
            time.sleep(0.05)

    def describe(self):
        lines = []
        for k in self.ranks:
            e = k.stderr().strip().splitlines()
            when = "running" if k.end is None else f"exit {k.rc} at {k.end:.2f} s"
            lines.append(f"  rank {k.rank} (host {k.host}): {when}: " +
                         (e[-1] if e else "(no stderr)"))
        return "\n".join(lines)

    def reports(self):
        out = []
        for k in self.ranks:
            rep = k.report()
            check(rep is not None, f"rank {k.rank}: no JSON report on stdout; stderr: {k.stderr().strip()[-2000:]}")
            out.append(rep)
        return out


# ---- the cases ----------------------------------------------------------------------------

class Tests:
    def __init__(self, a):
        self.bin = os.path.abspath(a.bin)
        self.tmp = os.path.abspath(a.tmp)
        self.slow = a.slow
        self.refs = {}

    def setup(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.makedirs(self.tmp)
        self.ckpt = os.path.join(self.tmp, "ckpt")
        # 48 MiB in two files, 65 tensors (a transformer layout: sharded matrices whose rows no
        # world divides, replicated 0-d and small tensors)
        run([self.bin, "synth", self.ckpt, "--size", "48MiB", "--shards", "2", "--seed", "7"])
        self.ckpt_bytes = sum(os.path.getsize(os.path.join(self.ckpt, f)) for f in os.listdir(self.ckpt))

    def reference(self, world, args):
        """The same load on one host over loopback (--nproc WORLD): each rank's dump as its
        size and SHA-256 (the files themselves are removed: 48 MiB and more a load)."""
        key = (world, tuple(args))
        if key not in self.refs:
            d = os.path.join(self.tmp, f"ref-{len(self.refs)}")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            env = {k: v for k, v in os.environ.items() if not LAUNCH_VARS.match(k)}
            r = run([self.bin, "load", self.ckpt, "--nproc", str(world), "--backend", "cpu", "--timeout", "60",
                     "--json", "--dump", d] + list(args), check=False, env=env, timeout=180)
            check(r.returncode == 0, f"reference load --nproc {world} {args} failed: {r.stderr.strip()[-2000:]}")
            self.refs[key] = {r: digest(os.path.join(d, f"rank-{r}.safetensors")) for r in range(world)}
            shutil.rmtree(d)
        return self.refs[key]

    def compare(self, job, args):
        """Every rank's dump is byte for byte the loopback load's; removed once it is."""
        ref = self.reference(job.world, args)
        for r in range(job.world):
            a = os.path.join(job.dump, f"rank-{r}.safetensors")
            check(os.path.exists(a), f"rank {r} wrote no dump {a}")
            got = digest(a)
            check(got == ref[r], f"rank {r}: dump {a} ({got[0]} bytes, sha256 {got[1][:16]}...) differs from the "
                                 f"loopback load's ({ref[r][0]} bytes, sha256 {ref[r][1][:16]}...)")
        extra = sorted(set(os.listdir(job.dump)) - {f"rank-{r}.safetensors" for r in range(job.world)})
        check(not extra, f"unexpected files in the dump directory: {extra}")
        shutil.rmtree(job.dump)

    def check_collective(self, reps, nhosts, per_host):
        """What DESIGN.md#hier says auto chooses for host staging: hier where the ranks span
        hosts and some host has several, gloo where every host has one."""
        names = {json.dumps(r["collective"], sort_keys=True) for r in reps}
        check(len(names) == 1, f"the ranks report different collectives: {names}")
        c = reps[0]["collective"]
        if per_host > 1:
            want = f"{nhosts} hosts ({'+'.join([str(per_host)] * nhosts)} ranks)"
            check(c["name"] == "hier" and want in c["reason"] and "shm within each host" in c["reason"],
                  f"collective {c}: want hier, '{want}', shm within each host")
        else:
            check(c["name"] == "gloo", f"collective {c}: want gloo (every host has one rank)")
        return c

    def load(self, net, nhosts, args, per_host=RANKS_PER_HOST, hidden=(), name="load"):
        """A good load across NHOSTS hosts, checked bit-exact against the loopback one, with
        the collective DESIGN.md names for the layout; in rank-0 mode what each host's ranks
        received crossed its link (its interface's counter grew by at least as much)."""
        job = Job(self, net, nhosts, args, self.t(20), per_host=per_host, hidden=hidden, name=name)
        rx = [net.rx_bytes(h) for h in range(nhosts)]
        job.start()
        job.wait(self.t(20) * 3)
        rx = [net.rx_bytes(h) - rx[h] for h in range(nhosts)]
        bad = [k for k in job.ranks if k.rc != 0]
        check(not bad, lambda: "ranks failed:\n" + job.describe())
        reps = job.reports()
        c = self.check_collective(reps, nhosts, per_host)
        self.compare(job, args)
        for r in reps:   # the tensor bytes of the files every rank agreed on
            cb = r["totals"]["checkpoint_bytes"]
            check(0.99 * self.ckpt_bytes < cb <= self.ckpt_bytes, f"rank {r['rank']}: checkpoint_bytes {cb} of "
                                                                  f"{self.ckpt_bytes} bytes of files")
        if "every-rank" not in args and "readers" not in args:
            for h in range(1, nhosts):
                got = sum(r["stats"]["bytes_received"] for r in reps if job.host_of(r["rank"]) == h)
                check(got > 0 and rx[h] >= got, f"host {h}'s ranks received {got} bytes, its link carried {rx[h]}")
        wall = max(k.end for k in job.ranks)
        return job, reps, c, wall

    def t(self, seconds):
        return int(round(seconds * self.slow))

    # -- good loads --

    def case_rank0_2x2(self, net):
        job, reps, c, wall = self.load(net, 2, [], name="rank0-2x2")
        return f"{wall:.2f} s, collective {c['name']}"

    def case_rank0_4x2(self, net):
        job, reps, c, wall = self.load(net, 4, [], name="rank0-4x2")
        return f"{wall:.2f} s, collective {c['name']}"

    def case_every_rank_2x2(self, net):
        job, reps, c, wall = self.load(net, 2, ["--source", "every-rank"], name="every-2x2")
        for r in reps:   # each rank read its own bytes; none crossed the network
            s = r["stats"]
            check(s["bytes_read"] > 0 and s["bytes_received"] == 0 and s["bytes_sent"] == 0,
                  f"rank {r['rank']}: every-rank stats {s}")
        return f"{wall:.2f} s"

    def case_every_rank_4x2(self, net):
        job, reps, c, wall = self.load(net, 4, ["--source", "every-rank"], name="every-4x2")
        return f"{wall:.2f} s"

    def check_hsdp(self, reps, nhosts):
        """DESIGN.md#data-flow (HSDP): rank 0 scatters within replica 0 (host 0) and each rank
        passes its part to the same position of the next replica (host), so rank 0 sends each
        checkpoint byte once and the last replica sends nothing."""
        total = reps[0]["totals"]["checkpoint_bytes"]
        sent0 = reps[0]["stats"]["bytes_sent"]
        check(total <= sent0 <= total + 4096, f"rank 0 sent {sent0} bytes of a {total}-byte checkpoint, want once")
        for r in reps:
            s, mine = r["stats"], r["totals"]["bytes"]
            if r["rank"]:
                check(s["bytes_received"] == mine, f"rank {r['rank']} received {s['bytes_received']}, holds {mine}")
            if r["rank"] // RANKS_PER_HOST == nhosts - 1:
                check(s["bytes_sent"] == 0, f"rank {r['rank']} of the last replica sent {s['bytes_sent']}")
            elif r["rank"]:
                check(s["bytes_sent"] == mine, f"rank {r['rank']} passed on {s['bytes_sent']} bytes, holds {mine}")
        return f"rank 0 sent {sent0 / total:.3f} x the checkpoint"

    def case_hsdp_2x2(self, net):
        # mesh 2x2, row-major: dim 0 (replicate) across the hosts, dim 1 (shard) within a host
        job, reps, c, wall = self.load(net, 2, ["--mesh", "2x2"], hidden=[1], name="hsdp-2x2")
        return f"{wall:.2f} s (host 1 without the checkpoint), {self.check_hsdp(reps, 2)}"

    def case_hsdp_4x2(self, net):
        job, reps, c, wall = self.load(net, 4, ["--mesh", "4x2"], name="hsdp-4x2")
        return f"{wall:.2f} s, {self.check_hsdp(reps, 4)}"

    def case_readers_only_4x2(self, net):
        # rank-0 mode with the checkpoint only where rank 0 runs: hosts 1-3 see an empty directory
        job, reps, c, wall = self.load(net, 4, [], hidden=[1, 2, 3], name="readers-only-4x2")
        return f"{wall:.2f} s (hosts 1-3 without the checkpoint)"

    def hidden_fails(self, net, args, words, named, name):
        """A load on 2 hosts where host 1 cannot see the checkpoint but must read it: every rank
        fails within the timeout saying WORDS (each in its stderr), and every rank of host 0
        names a rank of NAMED."""
        timeout = self.t(10)
        job = Job(self, net, 2, args, timeout, hidden=[1], dump=False, name=name)
        job.start()
        job.wait(3 * timeout + 20)
        for k in job.ranks:
            check(k.rc > 0, lambda: f"rank {k.rank} exit {k.rc}, want a failure:\n" + job.describe())
            check(k.end <= timeout, lambda: f"rank {k.rank} exited at {k.end:.2f} s, want <= {timeout} s:\n"
                                            + job.describe())
            err = k.stderr()
            check(all(w in err for w in words),
                  lambda: f"rank {k.rank} does not say {words}: {err.strip()[-1500:]}")
            if k.host != 1:
                check(named_ranks(err) & named, lambda: f"rank {k.rank} names no rank of {sorted(named)}: "
                                                        f"{err.strip()[-1500:]}")
        return max(k.end for k in job.ranks)

    def case_every_rank_hidden_fails(self, net):
        # the control for the hidden checkpoint: every-rank where host 1 cannot see it fails
        # every rank, host 1's naming what it could not open
        out = self.hidden_fails(net, ["--source", "every-rank"], ["SL_ERR_NOT_FOUND", "cannot open on this rank"],
                                {2, 3}, "every-hidden")
        return f"every rank out by {out:.2f} s, host 0's naming host 1's rank"

    # -- distributed readers (DESIGN.md#readers) --

    def check_readers(self, job, reps, readers):
        """Every checkpoint byte read once in the job, by READERS only, each about its share
        (within a 24 MiB shard file: the shares are whole files where files are many, else
        tensors); a rank that reads nothing sends nothing (but for the HSDP chain)."""
        total = reps[0]["totals"]["checkpoint_bytes"]
        read = {r["rank"]: r["stats"]["bytes_read"] for r in reps}
        check(sum(read.values()) == total, f"the ranks read {sum(read.values())} bytes of a {total}-byte checkpoint")
        for r, b in read.items():
            if r in readers:
                check(0 < b <= total / len(readers) + (24 << 20), f"reader rank {r} read {b} of {total} bytes")
            else:
                check(b == 0, f"rank {r} is no reader but read {b} bytes")
        # several readers over hier (or gloo) send at once: their transfers move in rounds, one
        # group op each, every rank taking part in each (docs/DESIGN.md#readers)
        if len(readers) > 1 and "--mesh" not in job.args:
            for r in reps:
                check(r["stats"]["rounds"] > 0, f"rank {r['rank']}: no round of the readers' transfers ran")
        return ", ".join(f"r{r} read {read[r] / 2**20:.1f} MiB" for r in sorted(readers))

    def case_readers_2x2(self, net):
        # one reader per host by default: the lowest rank of each (ranks 0 and 2)
        job, reps, c, wall = self.load(net, 2, ["--source", "readers"], name="readers-2x2")
        return f"{wall:.2f} s, {self.check_readers(job, reps, {0, 2})}"

    def case_readers_4x2(self, net):
        job, reps, c, wall = self.load(net, 4, ["--source", "readers"], name="readers-4x2")
        return f"{wall:.2f} s, {self.check_readers(job, reps, {0, 2, 4, 6})}"

    def case_readers_hidden_4x2(self, net):
        # two readers (ranks 0 and 2, hosts 0 and 1); hosts 2 and 3 cannot see the checkpoint
        job, reps, c, wall = self.load(net, 4, ["--source", "readers", "--readers", "2"], hidden=[2, 3],
                                       name="readers-hidden-4x2")
        return f"{wall:.2f} s (hosts 2-3 without the checkpoint), {self.check_readers(job, reps, {0, 2})}"

    def case_readers_hsdp_4x2(self, net):
        # HSDP across the hosts, a reader in every replica: each scatters within its own replica
        # (host) and the chain carries its parts both ways
        job, reps, c, wall = self.load(net, 4, ["--source", "readers", "--mesh", "4x2"], name="readers-hsdp-4x2")
        return f"{wall:.2f} s, {self.check_readers(job, reps, {0, 2, 4, 6})}"

    def case_reader_hidden_fails(self, net):
        # a reader (rank 2, host 1's lowest) that cannot see the checkpoint fails every rank
        # before any byte moves, host 0's ranks naming rank 2 (rank 2 its own error)
        out = self.hidden_fails(net, ["--source", "readers"], ["a reader"], {2}, "reader-hidden")
        return f"every rank out by {out:.2f} s, host 0's naming rank 2"

    def case_readers_figures(self, net):
        """rank 0's bytes sent and the load time at 4 hosts, rank-0 mode vs distributed readers,
        without and with a tbf limit on every host's link (both directions): the figures of
        bench/README.md, each the median of 3 loads taken in turn (the load's time: the slowest
        rank's sl_load; wall: the slowest rank's exit). What must hold: the readers' rank 0 sends
        about a quarter of what rank 0 sends alone, and no reader sends more than about a
        quarter of the checkpoint. Times are figures, not checks."""
        rate_mbit = 200
        out = []
        for limited in (False, True):
            if limited:
                for h in range(4):
                    net.limit(h, f"{rate_mbit}mbit")
            try:
                res = {"rank0": [], "readers": []}
                for i in range(3):
                    for mode in ("rank0", "readers"):
                        job, reps, c, wall = self.load(net, 4, ["--source", mode],
                                                       name=f"fig-{mode}-{int(limited)}-{i}")
                        res[mode].append((reps[0]["stats"]["bytes_sent"], max(r["stats"]["bytes_sent"] for r in reps),
                                          max(r["stats"]["seconds"] for r in reps), wall))
            finally:
                if limited:
                    for h in range(4):
                        net.unlimit(h)
            med = {m: [sorted(v[k] for v in res[m])[1] for k in range(4)] for m in res}
            s0, s1 = med["rank0"][0], med["readers"][0]
            check(s1 <= 0.35 * s0, f"rank 0 sent {s1} bytes as one of 4 readers, {s0} alone: want about a quarter")
            check(med["readers"][1] <= 0.35 * s0, f"a reader sent {med['readers'][1]} bytes, rank 0 alone {s0}")
            out.append(f"{'tbf ' + str(rate_mbit) + ' Mbit/s' if limited else 'no limit'}: rank0 mode rank 0 sent "
                       f"{s0 / 2**20:.1f} MiB, load {med['rank0'][2]:.2f} s (wall {med['rank0'][3]:.2f} s); readers "
                       f"rank 0 sent {s1 / 2**20:.1f} MiB (busiest reader {med['readers'][1] / 2**20:.1f} MiB), load "
                       f"{med['readers'][2]:.2f} s (wall {med['readers'][3]:.2f} s); rank0/readers load "
                       f"{med['rank0'][2] / med['readers'][2]:.2f}x")
        return "; ".join(out)

    def case_one_rank_per_host(self, net):
        job, reps, c, wall = self.load(net, 4, [], per_host=1, name="gloo-4x1")
        return f"{wall:.2f} s, collective {c['name']}"

    # -- faults --

    def case_rate_limit(self, net):
        rate_mbit = 80
        before = net.rx_bytes(1)
        net.limit(1, f"{rate_mbit}mbit")
        try:
            job, reps, c, wall = self.load(net, 2, [], name="tbf")
        finally:
            net.unlimit(1)
        got = net.rx_bytes(1) - before
        # what host 1 (ranks 2, 3) received crossed its link: at most rate_mbit/8 MB/s
        recv = sum(r["stats"]["bytes_received"] for r in reps if r["rank"] in (2, 3))
        check(got >= recv, f"host 1's link carried {got} bytes, less than its ranks received ({recv})")
        floor = recv / (rate_mbit * 1e6 / 8)
        seconds = max(r["stats"]["seconds"] for r in reps if r["rank"] in (2, 3))
        check(seconds >= 0.8 * floor, f"host 1's ranks loaded {recv} bytes in {seconds:.2f} s over a "
                                      f"{rate_mbit} Mbit/s link: faster than the limit allows ({floor:.2f} s)")
        check(wall <= 3 * floor + self.t(10), f"the limited load took {wall:.2f} s, want <= 3 x {floor:.2f} s + 10 s")
        return (f"{wall:.2f} s; host 1 received {recv / 2**20:.1f} MiB in {seconds:.2f} s "
                f"(floor {floor:.2f} s at {rate_mbit} Mbit/s, link carried {got / 2**20:.1f} MiB)")

    def fault_job(self, net, name, fault, args=(), trigger_bytes=2 << 20, rate="40mbit", nhosts=2, host=1):
        """A load on NHOSTS hosts of 2, host 1's link limited to RATE so the load lasts some seconds; once host 1
        has received TRIGGER_BYTES (the data phase is under way: the rendezvous moves some KiB)
        FAULT(job) runs. Returns the job and the fault's time from the job's start."""
        timeout = self.t(6)
        net.limit(host, rate)
        # the bytes host 1 received (host 0, which reads and sends, receives almost nothing)
        watch = host if host != 0 else 1
        try:
            before = net.rx_bytes(watch)
            job = Job(self, net, nhosts, list(args), timeout, dump=False, name=name)
            job.start()
            while net.rx_bytes(watch) - before < trigger_bytes:
                check(not job.poll(), lambda: "the job ended before the fault:\n" + job.describe())
                check(time.monotonic() - job.t0 < 3 * timeout, lambda: "host 1 received too little:\n" + job.describe())
                time.sleep(0.02)
            t_fault = time.monotonic() - job.t0
            fault(job)
            job.wait(t_fault + 4 * timeout + 20)
        finally:
            net.unlimit(host)
        return job, t_fault

    def check_failed(self, job, t_fault, lost_host, bound, namers, late=None):
        """Every rank exited non-zero (or was killed by the test) within BOUND seconds of the
        fault; each of NAMERS (ranks) names a rank of the other side: a survivor a rank of
        LOST_HOST, a rank of LOST_HOST a rank elsewhere; the others name some rank. LATE: ranks
        whose error must come within BOUND but whose exit may take until another bound (a
        product bug, reported). Returns each rank's seconds from the fault to its error and exit."""
        lost = {r for r in range(job.world) if job.host_of(r) == lost_host}
        late = late or {}
        times = []
        for k in job.ranks:
            check(k.rc != 0, lambda: f"rank {k.rank} exited 0 after the fault:\n" + job.describe())
            if k.rc < 0:   # killed by the test
                times.append(f"r{k.rank} killed")
                continue
            after = k.end - t_fault
            said = (k.said if k.said is not None else k.end) - t_fault
            times.append(f"r{k.rank} {after:.2f} s" if abs(after - said) < 0.1 else
                         f"r{k.rank} said {said:.2f} s, out {after:.2f} s")
            check(said <= bound, lambda: f"rank {k.rank} reported its error {said:.2f} s after the fault, want <= "
                                         f"{bound:.1f} s:\n" + job.describe())
            check(after <= late.get(k.rank, bound),
                  lambda: f"rank {k.rank} exited {after:.2f} s after the fault, want <= "
                          f"{late.get(k.rank, bound):.1f} s:\n" + job.describe())
            err = k.stderr()
            names = named_ranks(err)
            other = (set(range(job.world)) - lost) if k.rank in lost else lost
            if k.rank in namers:
                check(names & other, lambda: f"rank {k.rank} names no rank of {sorted(other)}: {err.strip()[-1500:]}")
            else:
                check(names, lambda: f"rank {k.rank} names no rank: {err.strip()[-1500:]}")
        return ", ".join(times)

    def slack(self):
        # past what the design accounts for: process start and teardown, the test's polling
        # (10-20 ms), a busy 2-core machine; measured overshoot is under 0.6 s
        return self.t(3)

    def fault_bound(self, timeout, diagnosis):
        """When every rank must have failed after a host goes silent: the timeout, then (with
        DIAGNOSIS, a Gloo communicator with the store: collectives/gloo/gloo.cc:find_lost) the
        question to rank 0's store, limited to min(timeout/2, 5 s) when it cannot be reached."""
        return timeout + (min(timeout / 2, 5) if diagnosis else 0) + self.slack()

    def silent_host(self, net, name, fault, heal, collective, nhosts=2, extra=(), host=1):
        """Host 1 goes silent mid-load (FAULT), with COLLECTIVE: hier (auto's choice for hosts
        of 2) or gloo. Every rank names a rank across (a survivor a rank of host 1, a rank of
        host 1 one elsewhere) and exits within the bound.

        gloo: the bound has the diagnosis's time (find_lost asks rank 0's store).
        hier: the leaders' and shm's communicators have no store to ask: the timeout alone. A
        leader's wait on another leader names the one it waited on; the ranks of a host wait on
        their leader over shm, which, while the leader is away in its Gloo step, gives it a
        timeout more and names whom the leader lost once it fails (collectives/shm/shm.c:
        sl__shm_away, sl__shm_break); on more than 2 hosts the leaders that waited on the
        step's root (stuck sending to host 1) hear from it whom it lost, within a grace
        (collectives/hier/hier.c: leader_failed). Every rank, rank 0 included, exits within the
        bound: the data plane's lost ranks reach the control plane (module.h: lost,
        note_lost), whose store then waits for none of host 1's ranks (which cannot hang up
        over a dead link)."""
        args = ([] if collective == "hier" else ["--collective", "gloo"]) + list(extra)
        try:
            job, tf = self.fault_job(net, name, fault, args=args, nhosts=nhosts, host=host)
        finally:
            heal()
        bound = self.fault_bound(job.timeout, collective == "gloo")
        if collective == "hier" and nhosts > 2:
            # the leaders' verdicts, which the silent host never sends: a grace of a quarter of
            # the timeout, 0.1-2 s (collectives/hier/hier.c: verdict_grace_ms, step_failed)
            bound += min(max(job.timeout / 4, 0.1), 2)
        times = self.check_failed(job, tf, host, bound, set(range(job.world)))
        return f"at {tf:.2f} s; after it: {times} (bound {bound:.1f} s)"

    def case_link_down(self, net):
        return self.silent_host(net, "link-down", lambda j: net.link(1, "down"), lambda: net.link(1, "up"), "hier")

    def case_link_down_gloo(self, net):
        return self.silent_host(net, "link-down-gloo", lambda j: net.link(1, "down"), lambda: net.link(1, "up"),
                                "gloo")

    def case_readers_link_down_4x2(self, net):
        # distributed readers (one per host) in rounds: host 1's leader, a reader, goes silent
        # inside a group op of every reader's transfer
        return self.silent_host(net, "readers-link-down-4x2", lambda j: net.link(1, "down"), lambda: net.link(1, "up"),
                                "hier", nhosts=4, extra=["--source", "readers"])

    def case_readers_link_down_last_root_4x2(self, net):
        # host 3, the round's last root, goes silent: a leader that finished its group before
        # the link went down waits, in the next, on leaders still stuck on host 3; their
        # verdicts name host 3 (collectives/hier/hier.c: step_failed; it named them, alive,
        # about one run in two before)
        return self.silent_host(net, "readers-link-down-last-root-4x2", lambda j: net.link(3, "down"),
                                lambda: net.link(3, "up"), "hier", nhosts=4, extra=["--source", "readers"], host=3)

    def case_readers_partition_gloo_4x2(self, net):
        return self.silent_host(net, "readers-partition-gloo-4x2", lambda j: net.partition(1), net.heal, "gloo",
                                nhosts=4, extra=["--source", "readers"])

    def case_link_down_host0_4x2(self, net):
        # host 0 (rank 0: the reader, and the rendezvous store's host) goes silent
        return self.silent_host(net, "link-down-host0-4x2", lambda j: net.link(0, "down"), lambda: net.link(0, "up"),
                                "hier", nhosts=4, host=0)

    def case_readers_link_down_host0_4x2(self, net):
        # host 0 goes silent inside a group of the readers' transfers: its leader hears no
        # other leader's verdict, so it is the one cut off
        return self.silent_host(net, "readers-link-down-host0-4x2", lambda j: net.link(0, "down"),
                                lambda: net.link(0, "up"), "hier", nhosts=4, host=0, extra=["--source", "readers"])

    def case_partition(self, net):
        return self.silent_host(net, "partition", lambda j: net.partition(1), net.heal, "hier")

    def case_partition_4x2(self, net):
        return self.silent_host(net, "partition-4x2", lambda j: net.partition(1), net.heal, "hier", nhosts=4)

    def case_partition_gloo(self, net):
        return self.silent_host(net, "partition-gloo", lambda j: net.partition(1), net.heal, "gloo")

    def case_partition_gloo_4x2(self, net):
        return self.silent_host(net, "partition-gloo-4x2", lambda j: net.partition(1), net.heal, "gloo", nhosts=4)

    def case_kill_host(self, net):
        def kill(job):
            for k in job.ranks:
                if k.host == 1:
                    os.kill(k.proc.pid, signal.SIGKILL)
        job, tf = self.fault_job(net, "kill-host", kill)
        for k in job.ranks:
            if k.host == 1:
                check(k.rc == -signal.SIGKILL, f"rank {k.rank} exit {k.rc}, want SIGKILL")
        # a closed connection is seen at once: no timeout to wait for
        bound = self.t(1) + self.slack()
        times = self.check_failed(job, tf, 1, bound, {0, 1})
        return f"killed at {tf:.2f} s; exits after it: {times} (bound {bound:.1f} s)"

    def rdzv_failed(self, job, bound, want):
        for k in job.ranks:
            err = k.stderr()
            check(k.rc not in (0, None) and k.rc > 0, f"rank {k.rank} exit {k.rc}:\n" + job.describe())
            check(k.end <= bound, f"rank {k.rank} exited at {k.end:.2f} s, want <= {bound:.1f} s:\n" + job.describe())
            w = want(k)
            check(all(s in err for s in w), f"rank {k.rank}: stderr lacks {w}: {err.strip()[-1500:]}")
        return max(k.end for k in job.ranks)

    def case_rdzv_unreachable(self, net):
        # the store's address is one nobody holds: rank 0 cannot serve it, the others cannot reach it
        timeout = self.t(6)
        job = Job(self, net, 2, [], timeout, rdzv_host=f"{NET}.200", dump=False, name="rdzv-nobody")
        job.start()
        job.wait(4 * timeout + 20)
        bound = timeout + self.slack()
        addr = f"{NET}.200:{job.port}"
        # rank 0 refuses at once to serve an address not its own; the others time out connecting
        worst = self.rdzv_failed(job, bound, lambda k: [addr, "cannot serve the rendezvous store"] if k.rank == 0
                                 else [addr, "SL_ERR_TIMEOUT", "connecting to the rendezvous store"])
        return f"every rank out by {worst:.2f} s (bound {bound:.1f} s), naming {addr}"

    def case_rdzv_dropped(self, net):
        # rank 0 serves the store, but host 0 drops its port for the other hosts: their ranks
        # time out on the store, and host 0's name the ranks that never arrived
        timeout = self.t(6)
        job = Job(self, net, 2, [], timeout, dump=False, name="rdzv-dropped")
        net.drop_port(0, job.port)
        try:
            job.start()
            job.wait(4 * timeout + 20)
        finally:
            net.undrop_port(0)
        # the report of the ranks that never arrived gets min(timeout/4, 2 s) past the deadline
        bound = timeout + min(timeout / 4, 2) + self.slack()
        addr = f"{NET}.1:{job.port}"
        worst = self.rdzv_failed(job, bound, lambda k: ["SL_ERR_TIMEOUT", "to join"] if k.host == 0
                                 else [addr, "SL_ERR_TIMEOUT", "connecting to the rendezvous store"])
        for k in job.ranks:
            if k.host == 0:
                check({2, 3} <= named_ranks(k.stderr()), f"rank {k.rank} does not name ranks 2, 3 as missing: "
                                                         f"{k.stderr().strip()[-1500:]}")
        return f"every rank out by {worst:.2f} s (bound {bound:.1f} s)"


CASES = [
    # (name, hosts, method)
    ("rank0_2x2", 2, "case_rank0_2x2"),
    ("every_rank_2x2", 2, "case_every_rank_2x2"),
    ("hsdp_2x2", 2, "case_hsdp_2x2"),
    ("rank0_4x2", 4, "case_rank0_4x2"),
    ("readers_only_4x2", 4, "case_readers_only_4x2"),
    ("every_rank_4x2", 4, "case_every_rank_4x2"),
    ("hsdp_4x2", 4, "case_hsdp_4x2"),
    ("every_rank_hidden_fails", 2, "case_every_rank_hidden_fails"),
    ("readers_2x2", 2, "case_readers_2x2"),
    ("readers_4x2", 4, "case_readers_4x2"),
    ("readers_hidden_4x2", 4, "case_readers_hidden_4x2"),
    ("readers_hsdp_4x2", 4, "case_readers_hsdp_4x2"),
    ("reader_hidden_fails", 2, "case_reader_hidden_fails"),
    ("readers_figures", 4, "case_readers_figures"),
    ("gloo_4x1", 4, "case_one_rank_per_host"),
    ("partition_4x2", 4, "case_partition_4x2"),
    ("readers_link_down_4x2", 4, "case_readers_link_down_4x2"),
    ("readers_partition_gloo_4x2", 4, "case_readers_partition_gloo_4x2"),
    ("readers_link_down_last_root_4x2", 4, "case_readers_link_down_last_root_4x2"),
    ("partition_gloo_4x2", 4, "case_partition_gloo_4x2"),
    ("link_down_host0_4x2", 4, "case_link_down_host0_4x2"),
    ("readers_link_down_host0_4x2", 4, "case_readers_link_down_host0_4x2"),
    ("rate_limit", 2, "case_rate_limit"),
    ("link_down", 2, "case_link_down"),
    ("link_down_gloo", 2, "case_link_down_gloo"),
    ("partition", 2, "case_partition"),
    ("partition_gloo", 2, "case_partition_gloo"),
    ("kill_host", 2, "case_kill_host"),
    ("rdzv_unreachable", 2, "case_rdzv_unreachable"),
    ("rdzv_dropped", 2, "case_rdzv_dropped"),
]
# Cases that assert the correct behaviour where the product does not give it yet; run only when
# named (--case), as reproductions. None now: the last one (readers_link_down_last_root_4x2,
# a leader a group ahead naming a live leader stuck on the silent host) is fixed by the
# leaders' verdicts after a failed step (collectives/hier/hier.c: step_failed).
KNOWN_BUGS = []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the shardload command")
    ap.add_argument("--tmp", required=True, help="a scratch directory (emptied)")
    ap.add_argument("--case", action="append", help="run only these cases (repeatable; --list names them)")
    ap.add_argument("--slow", type=float, default=1.0, help="scale every timeout and bound (a slower machine)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for name, _, _ in CASES:
            print(name)
        for name, _, _ in KNOWN_BUGS:
            print(name, "(a known bug: fails today; run only when named)")
        return 0
    chosen = [c for c in CASES if not a.case or c[0] in a.case]
    chosen += [c for c in KNOWN_BUGS if a.case and c[0] in a.case]
    if a.case and len(chosen) != len(set(a.case)):
        sys.exit(f"unknown case in {a.case}; --list names them")

    def on_signal(sig, _):
        raise KeyboardInterrupt(f"stopped by signal {sig}")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    if os.geteuid() == 0:
        remove_leftovers()
    why = capabilities()
    if why:
        print(f"multihost: SKIPPED: {why}", flush=True)
        return SKIP
    t = Tests(a)
    t.setup()
    start = time.monotonic()
    failed = []
    net = None
    try:
        for nhosts in sorted({c[1] for c in chosen}):
            net = Net(nhosts)
            net.up()
            try:
                for name, hosts, method in chosen:
                    if hosts != nhosts:
                        continue
                    c0 = time.monotonic()
                    try:
                        what = getattr(t, method)(net)
                        log(f"PASS {name} ({time.monotonic() - c0:.1f} s): {what}")
                    except (Failure, RuntimeError, subprocess.TimeoutExpired) as e:
                        failed.append(name)
                        log(f"FAIL {name} ({time.monotonic() - c0:.1f} s): {e}")
                    except Exception:   # a defect of the harness: the other cases still run
                        failed.append(name)
                        log(f"FAIL {name} ({time.monotonic() - c0:.1f} s):\n{traceback.format_exc()}")
                    killed = net.reset()
                    if killed and name not in failed:
                        failed.append(name)
                        log(f"FAIL {name}: processes {killed} were left in the hosts after it")
            finally:
                net.down()
                net = None
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}): namespaces removed")
        return 1
    finally:
        if net:
            net.down()
    log(f"{len(chosen) - len(failed)} of {len(chosen)} cases passed in {time.monotonic() - start:.1f} s"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
