"""shardload.torch (load_model, load_sharded) against torch's own loading, on a CPU Gloo world.

Run under torchrun (the ctest entry python_torch_api runs worlds 2 and 3, then world 4 for
load_sharded on a 2x2 mesh):
    torchrun --standalone --nproc-per-node 3 python/tests/test_torch_api.py --tmp DIR

load_model: a ToyLlama (HF naming, vocab 37: uneven shards) wrapped with fully_shard, loaded
from a .safetensors file, a directory, an index.json and rank 0's state dict, under no policy
and CPUOffloadPolicy, with cpu_offload True/False/None: every local shard bit-identical to the
model torch itself loads (set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)),
placed by the contract's row; strict=True refuses a missing and an unexpected key on every
rank in torch's wording and leaves the model as it was; strict=False returns the same lists on
every rank and loads the rest; a shape mismatch is refused either way; a subgroup loads alone
(world 3: ranks [1, 2], whose rank 0 is global rank 1). load_sharded: Shard(0), Shard(1),
Shard(-1), Replicate, a callable placements, a dtype cast and 2-D meshes, each bit-identical
to distribute_tensor of the stored tensor; its argument errors on every rank. A tied model
(FSDP2 and plain) loads tied: one Parameter under both names, an optimizer step moves both.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__" and "--worlds" in sys.argv:  # the ctest entry: once per world
    import _torchrun
    i = sys.argv.index("--worlds")
    sys.exit(_torchrun.run(__file__, sys.argv[i + 1].split(","), sys.argv[1:i] + sys.argv[i + 2:],
                           ("torch", "safetensors"), lambda w: ["--sharded-only"] if w == "4" else []))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

import shardload  # noqa: E402
import shardload.torch as slt  # noqa: E402
from _model import ToyLlama, reference_state_dict, save_sharded  # noqa: E402

RANK = WORLD = 0
CHECKS = 0


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        raise AssertionError(f"rank {RANK}: {what}")


def expect_error(fn, *needles, kind=shardload.ShardloadError):
    try:
        fn()
    except kind as e:
        for n in needles:
            check(n in str(e), f"error should name {n!r}: {e}")
        return str(e)
    raise AssertionError(f"rank {RANK}: expected a {kind.__name__} naming {needles}")


def same_everywhere(obj, what, group=None):
    n = dist.get_world_size(group)
    out = [None] * n
    dist.all_gather_object(out, obj, group=group)
    check(all(o == out[0] for o in out), f"{what} differs between ranks: {out}")


def shard_model(model, mesh, policy):
    kw = {"mesh": mesh}
    if policy is not None:
        kw["offload_policy"] = policy
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def build(policy=None, mesh=None, meta=True, seed=None, buffers=True):
    if meta:
        with torch.device("meta"):
            m = ToyLlama(buffers=buffers)
    else:
        torch.manual_seed(seed if seed is not None else 99)
        m = ToyLlama(buffers=buffers)
    return shard_model(m, mesh if mesh is not None else init_device_mesh("cpu", (WORLD,)), policy)


def torch_loaded(sd, policy):
    """The model as torch itself loads rank 0's full state dict into it."""
    m = build(policy)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(m, {k: v.clone() for k, v in sd.items()} if RANK == 0 else {}, options=opts)
    return m


def distributed_ref(sd, model):
    """MODEL holding distribute_tensor(full, its mesh, its placements) of every entry: what
    torch makes of the full tensors, without set_model_state_dict's broadcast from rank 0."""
    out = {}
    for k, v in model.state_dict().items():
        full = sd[k].to(v.dtype)
        out[k] = distribute_tensor(full, v.device_mesh, v.placements) if isinstance(v, DTensor) else full.clone()
    model.load_state_dict(out, assign=True)
    return model


def local_bytes(t):
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same_model(ref, m, label, skip=()):
    a, b = ref.state_dict(), m.state_dict()
    check(list(a) == list(b), f"{label}: state dict keys differ")
    for k in a:
        if k in skip:
            continue
        x, y = a[k], b[k]
        check(type(x) is type(y), f"{label}: {k} is {type(y).__name__}, torch's {type(x).__name__}")
        if isinstance(x, DTensor):
            check(x.placements == y.placements and x.device_mesh == y.device_mesh, f"{label}: {k} placements")
            check(x.to_local().shape == y.to_local().shape, f"{label}: {k} local shape")
        check(x.dtype == y.dtype and x.shape == y.shape, f"{label}: {k} {y.dtype}{tuple(y.shape)}")
        check(torch.equal(local_bytes(x), local_bytes(y)), f"{label}: {k} local shard bytes differ from torch's")


def expect_rule(policy, cpu_offload):
    if cpu_offload is True:
        return "cpu", "cpu_offload=on"
    if cpu_offload is False:
        return "device", "cpu_offload=off"
    if isinstance(policy, CPUOffloadPolicy):
        return "cpu", "inferred: CPU offload policy"
    return "device", "inferred: no offload policy"


def write_checkpoints(tmp, sd):
    """The same weights as one file, a directory (two shards + index.json)."""
    f = os.path.join(tmp, "one", "model.safetensors")
    d = os.path.join(tmp, "dir")
    if RANK == 0:
        os.makedirs(os.path.dirname(f), exist_ok=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, f)
        save_sharded(sd, d)
    dist.barrier()
    return {"file": f, "dir": d, "index": os.path.join(d, "model.safetensors.index.json")}


def forms_and_offload(tmp, sd, paths):
    n = 0
    for policy in (None, CPUOffloadPolicy(pin_memory=False)):
        ref = torch_loaded(sd, policy)
        cases = [(form, None) for form in ("file", "dir", "index", "dict")]
        cases += [("dir", True), ("dir", False), ("dict", True)]
        for form, cpu_offload in cases:
            label = f"policy={policy} form={form} cpu_offload={cpu_offload}"
            m = build(policy)
            src = paths[form] if form != "dict" else (sd if RANK == 0 else None)
            out = slt.load_model(m, src, cpu_offload=cpu_offload)
            check(out == ([], []), f"{label}: returned {out}")
            same_model(ref, m, label)
            rep = slt.last_load_report()
            for k, r in rep.items():
                want = expect_rule(policy, cpu_offload) if "note" not in r else ("device", "cpu_offload=off")
                check((r["placed"], r["rule"]) == want, f"{label}: {k} placed {r['placed']} by '{r['rule']}', "
                      f"want {want}")
                t = m.state_dict()[k]
                t = t.to_local() if isinstance(t, DTensor) else t
                check(r["device"] == str(t.device), f"{label}: {k} reported on {r['device']}, it is on {t.device}")
            check(len(rep) == len(sd), f"{label}: {len(rep)} of {len(sd)} entries reported")
            n += 1
    # in place into a materialised model; then one training step on what was loaded
    m = build(None, meta=False)
    before = {k: v.to_local().data_ptr() for k, v in m.named_parameters()}
    slt.load_model(m, paths["dir"])
    check(all(slt.last_load_report()[k]["in_place"] and m.get_parameter(k).to_local().data_ptr() == p
              for k, p in before.items()), "materialised model: not loaded in place")
    same_model(torch_loaded(sd, None), m, "in place")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randint(0, 37, (2, 5))).pow(2).mean().backward()
    opt.step()
    if RANK == 0:
        print(f"load_model: {n} loads (file, directory, index.json, rank 0's dict x policies x cpu_offload) "
              "bit-identical to set_model_state_dict's; in place: ok", flush=True)


def strictness(tmp, sd, paths):
    short = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    extra = dict(sd, **{"model.unused.weight": torch.ones(3)})
    both = dict(short, **{"model.unused.weight": torch.ones(3)})
    d = {}
    for name, s in (("short", short), ("extra", extra), ("both", both)):
        d[name] = os.path.join(tmp, name)
        if RANK == 0:
            save_sharded(s, d[name])
    dist.barrier()
    for form in ("path", "dict"):
        def src(name, table):
            return d[name] if form == "path" else (table if RANK == 0 else None)
        # strict: one error on every rank, worded as torch's, and the model as it was
        for name, table, needles in (("short", short, ['Missing key(s) in state_dict: "model.norm.weight"']),
                                     ("extra", extra, ['Unexpected key(s) in state_dict: "model.unused.weight"']),
                                     ("both", both, ['Missing key(s) in state_dict: "model.norm.weight"',
                                                     'Unexpected key(s) in state_dict: "model.unused.weight"'])):
            m = build(None, meta=False)
            snap = {k: local_bytes(v).clone() for k, v in m.state_dict().items()}
            msg = expect_error(lambda: slt.load_model(m, src(name, table)), "Error(s) in loading state_dict for FSDPToyLlama",
                               "strict=False", *needles, kind=RuntimeError)
            same_everywhere(msg, f"strict {form} {name}: the error")
            check(all(torch.equal(snap[k], local_bytes(v)) for k, v in m.state_dict().items()),
                  f"strict {form} {name}: the model changed")
        # not strict: the lists back, equal on every rank; the rest loaded; the missing as it was
        ref = torch_loaded(sd, None)
        m = build(None, meta=False, seed=5)
        kept = local_bytes(m.model.norm.weight).clone()
        missing, unexpected = slt.load_model(m, src("both", both), strict=False)
        check((missing, unexpected) == (["model.norm.weight"], ["model.unused.weight"]),
              f"strict=False {form}: returned {missing}, {unexpected}")
        same_everywhere((missing, unexpected), f"strict=False {form}: the lists")
        same_model(ref, m, f"strict=False {form}", skip={"model.norm.weight"})
        check(torch.equal(local_bytes(m.model.norm.weight), kept), f"strict=False {form}: the missing entry changed")
        check("model.norm.weight" not in slt.last_load_report(), f"strict=False {form}: the missing entry reported")
        # a meta model too: the missing entry stays on the meta device
        m = build(None)
        out = slt.load_model(m, src("short", short), strict=False)
        check(out == (["model.norm.weight"], []) and m.model.norm.weight.to_local().is_meta,
              f"strict=False meta {form}: {out}")
    # a shape mismatch: refused with strict either way, naming the entry and both shapes
    bad = dict(sd, **{"lm_head.weight": sd["lm_head.weight"][:-1].clone()})
    dbad = os.path.join(tmp, "bad-shape")
    if RANK == 0:
        save_sharded(bad, dbad)
    dist.barrier()
    for strict in (True, False):
        for form in ("path", "dict"):
            m = build(None)
            msg = expect_error(lambda: slt.load_model(m, dbad if form == "path" else (bad if RANK == 0 else None),
                                                      strict=strict),
                               "size mismatch for lm_head.weight", "[36, 16]", "[37, 16]")
            same_everywhere(msg, f"size mismatch strict={strict} {form}: the error")
    expect_error(lambda: slt.load_model(build(None), paths["dir"], cpu_offload="yes"), "cpu_offload", kind=TypeError)
    expect_error(lambda: slt.load_model(build(None), paths["dir"], strict=1), "strict", kind=TypeError)
    if RANK == 0:
        print("load_model strict: missing/unexpected refused on every rank in torch's wording, the model as it "
              "was; strict=False: the same lists on every rank; size mismatch: refused", flush=True)


def subgroup(tmp, sd, paths):
    """World 3: ranks [1, 2] load alone; their rank 0 (global 1) reads and passes the state dict."""
    ranks = [1, 2]
    pg = dist.new_group(ranks)
    if RANK in ranks:
        mesh = DeviceMesh.from_group(pg, "cpu")
        # torch's set_model_state_dict broadcasts from global rank 0, which is not in the group:
        # the reference is distribute_tensor of the full tensors on the group's mesh
        ref = distributed_ref(sd, build(None, mesh=mesh))
        for form in ("dir", "dict"):
            m = build(CPUOffloadPolicy(pin_memory=False), mesh=mesh)
            src = paths["dir"] if form == "dir" else (sd if RANK == ranks[0] else None)
            out = slt.load_model(m, src, process_group=pg)
            check(out == ([], []), f"subgroup {form}: {out}")
            same_model(ref, m, f"subgroup {form}")
            check(slt.last_load_report()["lm_head.weight"]["rule"] == "inferred: CPU offload policy",
                  f"subgroup {form}: {slt.last_load_report()['lm_head.weight']}")
        # a model on the group's mesh, loaded as if by the default group: refused, naming the group
        m = build(None, mesh=mesh)
        expect_error(lambda: slt.load_model(m, paths["dir"], process_group=None), "[1, 2]", "process_group",
                     kind=ValueError)
        # load_sharded onto the group's 1-D mesh
        full = load_file(paths["file"])
        def ps(name):
            return [Shard(0)] if full[name].dim() else [Replicate()]
        out = slt.load_sharded(paths["dir"], mesh, ps)
        check(sorted(out) == sorted(full), f"subgroup load_sharded: {sorted(out)}")
        for k, v in out.items():
            want = distribute_tensor(full[k], mesh, ps(k))
            check(torch.equal(local_bytes(v), local_bytes(want)), f"subgroup load_sharded: {k}")
    else:
        expect_error(lambda: slt.load_model(build(None), paths["dir"], process_group=pg), "not one of its ranks",
                     kind=ValueError)
    # a context of shardload's own API over the subgroup counts as much as load_model's
    if RANK in ranks:
        shardload.Context("cpu", process_group=pg).close()
    # a second subgroup of 2 sharing rank 1, which has made 4 contexts of world size 2 and rank
    # 0 none: libshardload would have them wait under different keys; both say so at once
    pg2 = dist.new_group([0, 1])
    if RANK in (0, 1):
        mesh2 = DeviceMesh.from_group(pg2, "cpu")
        expect_error(lambda: slt.load_model(build(None, mesh=mesh2), paths["dir"], process_group=pg2),
                     "process_group [0, 1]", "[0, 4] shardload contexts of world size 2", kind=ValueError)
    dist.barrier()
    if RANK == 0:
        print(f"process_group: the subgroup {ranks} of world {WORLD} loads alone, bit-identical to torch's", flush=True)


def grid_checkpoint(tmp):
    torch.manual_seed(7)
    sd = {"a.weight": torch.randn(37, 16), "b.weight": torch.randn(16, 10).to(torch.bfloat16),
          "c.ids": torch.arange(7, dtype=torch.int64) * 5, "d.cube": torch.randn(5, 3, 4).to(torch.float16),
          "e.scale": torch.tensor(0.5), "f.vec": torch.randn(3)}
    d = os.path.join(tmp, "grid")
    if RANK == 0:
        save_sharded(sd, d, shards=2)
    dist.barrier()
    return sd, d


def compare_sharded(out, full, mesh, placements_of, label, dtype=None):
    check(sorted(out) == sorted(full), f"{label}: keys {sorted(out)}")
    for k, v in out.items():
        ps = placements_of(k)
        want_full = full[k].to(dtype) if dtype is not None and full[k].is_floating_point() else full[k]
        want = distribute_tensor(want_full, mesh, ps)
        check(isinstance(v, DTensor) and v.device_mesh == mesh, f"{label}: {k} not a DTensor on the mesh")
        check(tuple(v.placements) == tuple(want.placements), f"{label}: {k} placements {v.placements}, want {want.placements}")
        check(v.dtype == want.dtype and v.shape == want.shape and v.stride() == want.stride(),
              f"{label}: {k} {v.dtype}{tuple(v.shape)}, want {want.dtype}{tuple(want.shape)}")
        check(v.to_local().shape == want.to_local().shape, f"{label}: {k} local {tuple(v.to_local().shape)}, "
              f"want {tuple(want.to_local().shape)}")
        check(torch.equal(local_bytes(v), local_bytes(want)), f"{label}: {k} local bytes differ from distribute_tensor's")
        check(torch.equal(v.full_tensor(), want_full), f"{label}: {k} full tensor")


def sharded(tmp, sd_path):
    full, d = grid_checkpoint(tmp)
    mesh = init_device_mesh("cpu", (WORLD,))

    def nd_safe(p):  # Shard(p) where the tensor has the dim, else Replicate
        return lambda name: [Shard(p)] if full[name].dim() > (p if p >= 0 else -p - 1) else [Replicate()]
    n = 0
    for label, placements in (("Shard(0)", nd_safe(0)), ("Shard(1)", nd_safe(1)), ("Shard(-1)", nd_safe(-1)),
                              ("Replicate", [Replicate()])):
        out = slt.load_sharded(d, mesh, placements)
        compare_sharded(out, full, mesh, placements if callable(placements) else lambda _: placements, label)
        n += 1
    # one list for every tensor, on a checkpoint all of whose tensors have a dim 0
    plain = {k: v for k, v in full.items() if v.dim() >= 1}
    f = os.path.join(tmp, "grid1", "model.safetensors")
    if RANK == 0:
        os.makedirs(os.path.dirname(f), exist_ok=True)
        save_file(plain, f)
    dist.barrier()
    out = slt.load_sharded(f, mesh, [Shard(0)])
    compare_sharded(out, plain, mesh, lambda _: [Shard(0)], "one list [Shard(0)]")
    # a dtype cast: floating tensors as torch's .to() rounds them, integers as stored
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        out = slt.load_sharded(d, mesh, nd_safe(0), dtype=dtype, device=torch.device("cpu"))
        compare_sharded(out, full, mesh, nd_safe(0), f"dtype={dtype}", dtype=dtype)
        check(out["c.ids"].dtype == torch.int64, f"dtype={dtype}: c.ids is {out['c.ids'].dtype}")
        n += 1
    out = slt.load_sharded(d, mesh, [Replicate()], cpu_offload=True)
    check(all(v.to_local().device.type == "cpu" for v in out.values()), "cpu_offload=True: host memory")
    # 2-D meshes: every combination of Shard(0), Shard(1), Replicate over both dims
    shapes = [(WORLD // 2, 2)] if WORLD % 2 == 0 and WORLD > 2 else [(1, WORLD), (WORLD, 1)]
    for shape in shapes:
        mesh2 = init_device_mesh("cpu", shape)
        for p0 in (Shard(0), Shard(1), Replicate()):
            for p1 in (Shard(0), Shard(1), Replicate()):
                def ps(name, p0=p0, p1=p1):
                    return [p if not isinstance(p, Shard) or full[name].dim() > p.dim else Replicate() for p in (p0, p1)]
                out = slt.load_sharded(d, mesh2, ps)
                compare_sharded(out, full, mesh2, ps, f"mesh {shape} [{p0}, {p1}]")
                n += 1
    # argument errors: on every rank, naming what is wrong
    expect_error(lambda: slt.load_sharded(d, mesh, [Shard(1)]), "'c.ids'", "Shard(1) needs a tensor of at least 2 dims", "Replicate()")
    expect_error(lambda: slt.load_sharded(d, mesh, [Shard(0), Shard(0)]), "one per mesh dim")
    if WORLD > 1:
        expect_error(lambda: slt.load_sharded(d, mesh, nd_safe(0) if RANK == 0 else [Replicate()]),
                     "rank 1 of the mesh gives other placements")
    expect_error(lambda: slt.load_sharded(d, mesh, [Replicate()], dtype=torch.int32), "dtype", kind=TypeError)
    expect_error(lambda: slt.load_sharded(d, mesh, [Replicate()], device=torch.device("meta")), "device",
                 kind=ValueError)
    expect_error(lambda: slt.load_sharded(full, mesh, [Replicate()]), "path", kind=TypeError)
    expect_error(lambda: slt.load_sharded(os.path.join(tmp, "nowhere"), mesh, [Replicate()]), "nowhere")
    if RANK == 0:
        print(f"load_sharded: {n} loads (Shard(0/1/-1), Replicate, callable, dtype casts, 2-D meshes {shapes}) "
              "bit-identical to distribute_tensor's; argument errors on every rank", flush=True)


class Tied(torch.nn.Module):
    """Embedding and head tied (one Parameter under two names), as tied LM heads are."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(37, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 37, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.mid(self.emb(ids)))


def tied(tmp):
    """A tied model loads tied (FSDP2 and plain): both names one Parameter, one step moves both."""
    from safetensors.torch import save_model
    path = os.path.join(tmp, "tied.safetensors")
    torch.manual_seed(7)
    ref = Tied()
    if RANK == 0:
        save_model(ref, path)  # the tie saved once
    dist.barrier()
    for fsdp in (True, False):
        torch.manual_seed(100 + RANK)
        m = Tied()
        if fsdp:
            fully_shard(m, mesh=init_device_mesh("cpu", (WORLD,)))
        check(slt.load_model(m, path) == ([], []), "tied: nothing missing or unexpected")
        label = "FSDP2" if fsdp else "plain"
        check(m.head.weight is m.emb.weight, f"tied ({label}): head.weight is emb.weight after the load")
        check(len(list(m.parameters())) == 3, f"tied ({label}): one Parameter for both names")
        full = m.emb.weight.full_tensor() if fsdp else m.emb.weight
        check(torch.equal(full.detach(), ref.emb.weight.detach()), f"tied ({label}): the saved values")
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        m(torch.tensor([[1, 2, 3]])).sum().backward()
        opt.step()
        check(m.head.weight is m.emb.weight, f"tied ({label}): still tied after a step")
        after = m.emb.weight.full_tensor() if fsdp else m.emb.weight
        check(not torch.equal(after.detach(), ref.emb.weight.detach()), f"tied ({label}): the step moved it")
    seen = []  # load_sharded's progress: on the mesh's rank 0, to the last tensor
    out = slt.load_sharded(path, init_device_mesh("cpu", (WORLD,)), [Shard(0)], progress=lambda *a: seen.append(a))
    check(sorted(out) == ["emb.weight", "mid.bias", "mid.weight"], f"load_sharded of the tied file: {sorted(out)}")
    check((seen[-1][2:] == (3, 3) and seen[-1][0] == seen[-1][1]) if RANK == 0 else not seen,
          f"load_sharded progress on rank {RANK}: {seen[-3:]}")


class _Unreadable(dict):
    """Rank 0's state dict whose iteration fails (a lazy Mapping over a broken store)."""

    def __iter__(self):
        raise OSError("the store went away")

    def items(self):
        raise OSError("the store went away")


def mapping_fails(tmp):
    """Rank 0's Mapping failing to iterate fails every rank, promptly (no rank left waiting)."""
    t0 = time.monotonic()
    src = _Unreadable(Tied().state_dict()) if RANK == 0 else None
    expect_error(lambda: slt.load_model(Tied(), src), "the store went away", kind=Exception)
    check(time.monotonic() - t0 < 30, f"rank {RANK}: the failing Mapping took {time.monotonic() - t0:.0f} s")


def main():
    global RANK, WORLD
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stuck run's stacks: kill -USR1
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--sharded-only", action="store_true", help="load_sharded only (world 4: the 2x2 mesh)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    tmp = os.path.join(a.tmp, f"w{WORLD}")
    os.makedirs(tmp, exist_ok=True)
    t0 = time.monotonic()
    try:
        sd = reference_state_dict(buffers=True)
        sd["logit_scale"] = torch.tensor(0.75)
        sd["position_ids"] = torch.arange(8, dtype=torch.int64) * 3
        paths = write_checkpoints(tmp, sd)
        if not a.sharded_only:
            forms_and_offload(tmp, sd, paths)
            strictness(tmp, sd, paths)
            tied(tmp)
            mapping_fails(tmp)
            if WORLD == 3:
                subgroup(tmp, sd, paths)
        sharded(tmp, paths)
        from shardload import _dlpack
        check(_dlpack.live_count() == 0, f"{_dlpack.live_count()} DLPack exports never released")
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # the others fail by their own timeouts/errors; never hang in teardown
    dist.barrier()
    if RANK == 0:
        print(f"test_torch_api world {WORLD}: {CHECKS} checks on rank 0 passed in {time.monotonic() - t0:.1f} s",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
