#!/usr/bin/env python3
"""A model of the load time of rank-0 reads against distributed readers (docs/DESIGN.md#readers),
as a function of the number of hosts, each host's storage bandwidth and each host's link.
Python standard library only.

    readers_model.py                       # the table for a 405B-class checkpoint (812 GB)
    readers_model.py --bytes 48MiB --hosts 4 --disk 2000 --nic 0.05 --ranks-per-host 2

Assumptions (what the loader does, docs/DESIGN.md#data-flow and #readers):
- reads overlap sends (the pipeline), so a mode's time is the larger of its read time and its
  network time, plus a fixed start (--start seconds: rendezvous, headers, agreements);
- rank-0 mode: one disk reads B; rank 0's link sends every other host's share, B (H-1)/H
  (host staging sends each host's parts once, to its leader: the hier collective);
- distributed readers over a collective without scatterv_group (one operation at a time):
  R readers, each reads B/R, up to min(R, slots - 1) of them at once (slots = min(8, R + 1)),
  each host's readers sharing its disk; the network time is the sum over transfers of what
  crosses the root's link: B (H-1)/H at one link's rate ("serial");
- distributed readers in rounds (as built over gloo, hier and nccl: their scatterv_group):
  M = min(R, 8) readers' transfers move at once, one each, through 2M + 1 slots (at most 17),
  so M readers read while M others' bytes move; the cross-host bytes go through min(M, H)
  links at once, and each host's link receives what its ranks own from other hosts,
  B (H-1)/H^2 ("rounds");
- every reader's transfer in flight at once (no limit of 8 a round; not built): as rounds with
  M = R ("all at once").
Bandwidths are per host, in GB/s (1e9 bytes); sizes take KiB/MiB/GiB/TB suffixes.
"""
import argparse
import re


def parse_size(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?|B)?\s*", s)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s}")
    v, u = float(m.group(1)), (m.group(2) or "B").rstrip("B")
    mult = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[u]
    return v * mult


def model(B, H, disk, nic, readers=0, start=0.0):
    """Seconds: (rank-0 mode, readers one operation at a time, readers in rounds, all at once)."""
    gb = 1e9
    R = readers or H
    cross = B * (H - 1) / H                    # bytes that must leave their reader's host
    per_host_recv = B * (H - 1) / H / H        # what each host's ranks receive from the others
    t_rank0 = max(B / (disk * gb), cross / (nic * gb))

    def readers_time(reading, sending_links):
        read = B / (min(reading, H) * disk * gb)   # each host's readers share its disk
        net = max(cross / (min(sending_links, H) * nic * gb), per_host_recv / (nic * gb))
        return max(read, net)

    t_serial = max(B / (min(min(R, 7), H) * disk * gb), cross / (nic * gb))
    M = min(R, 8)
    t_rounds = readers_time(M, M)
    t_all = readers_time(R, R)
    return start + t_rank0, start + t_serial, start + t_rounds, start + t_all


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=parse_size, default=812e9, help="checkpoint size (default 812 GB)")
    ap.add_argument("--hosts", default="2,4,8,16,32,64", help="host counts, comma-separated")
    ap.add_argument("--disk", default="2,10", help="each host's storage read rate, GB/s (comma-separated)")
    ap.add_argument("--nic", default="50", help="each host's link rate, GB/s (comma-separated)")
    ap.add_argument("--readers", type=int, default=0, help="readers (0: one per host)")
    ap.add_argument("--start", type=float, default=0.0, help="fixed seconds added to every mode")
    a = ap.parse_args()
    print(f"checkpoint {a.bytes / 1e9:.3g} GB; readers: {a.readers or 'one per host'}; seconds, and rank-0 mode / "
          f"each")
    print(f"{'hosts':>5} {'disk GB/s':>9} {'link GB/s':>9} {'rank0 s':>9} {'serial s':>9} {'x':>6} "
          f"{'rounds s':>9} {'x':>6} {'all-at-once s':>13} {'x':>6}")
    for d in map(float, a.disk.split(",")):
        for n in map(float, a.nic.split(",")):
            for h in map(int, a.hosts.split(",")):
                t0, t1, t2, t3 = model(a.bytes, h, d, n, a.readers, a.start)
                print(f"{h:5d} {d:9.3g} {n:9.3g} {t0:9.2f} {t1:9.2f} {t0 / t1:6.2f} {t2:9.2f} {t0 / t2:6.2f} "
                      f"{t3:13.2f} {t0 / t3:6.2f}")


if __name__ == "__main__":
    main()
