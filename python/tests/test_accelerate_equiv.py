"""The drop-in against Accelerate's own fsdp2_load_full_state_dict, on a CPU Gloo world.

Run under torchrun (the ctest entries do so for worlds 2 and 3):
    torchrun --standalone --nproc-per-node 3 python/tests/test_accelerate_equiv.py --tmp DIR

For every offload policy FSDP2 accepts here (none, CPUOffloadPolicy without and, where pinned
memory exists, with pin_memory) x call form (cpu_offload=True/False/None, the legacy three
positional arguments) x full_sd form (rank 0's dict, a checkpoint path), a ToyLlama
(HF naming, vocab 37: uneven shards at worlds 2 and 3) wrapped with fully_shard is loaded once
by Accelerate's function and once by the drop-in: every parameter's local shard must be
bit-identical, a DTensor with the same placements, on the device the placement table names
(pinned as it says), and an SGD step afterwards must give the same finite parameters (on a cuda
mesh only where FSDP2 trains that placement: not host shards without a CPUOffloadPolicy, nor
device shards with one; their shards are still compared). Then the
cases where Accelerate's function fails: a checkpoint dtype other than the parameters', a key
missing on either side, plain and 0-d buffers, tied weights saved once; 2-D (HSDP) meshes;
loading in place into a materialised model; and patch()/unpatch().
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__" and "--world" in sys.argv:  # the ctest entry
    import _torchrun
    i = sys.argv.index("--world")
    sys.exit(_torchrun.run(__file__, [sys.argv[i + 1]], sys.argv[1:i] + sys.argv[i + 2:],
                           ("accelerate", "safetensors", "torch")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import shardload  # noqa: E402
import shardload.accelerate as sla  # noqa: E402
from _model import ToyLlama, reference_state_dict, save_sharded  # noqa: E402

RANK = WORLD = 0
DEVICE = "cpu"  # the meshes' device type: --device cuda on a GPU machine (bench/gpu-check.sh)
CHECKS = 0


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        raise AssertionError(f"rank {RANK}: {what}")


def build(policy, dtype=torch.float32, buffers=False, tied=False, mesh_shape=None):
    with torch.device("meta"):
        m = ToyLlama(buffers=buffers).to(dtype)
        if tied:  # lm_head shares the embedding, as tie_word_embeddings models do
            m.lm_head.weight = m.model.embed_tokens.weight
    if mesh_shape is None:
        mesh = init_device_mesh(DEVICE, (WORLD,))
    else:  # 2-D: HSDP, replicate over dim 0, shard over dim 1
        mesh = init_device_mesh(DEVICE, mesh_shape, mesh_dim_names=("replicate", "shard"))
    kw = {"mesh": mesh}
    if policy is not None:
        kw["offload_policy"] = policy
    for layer in m.model.layers:
        fully_shard(layer, **kw)
    fully_shard(m, **kw)
    return m


def accel():
    dev = torch.device("cpu") if DEVICE == "cpu" else torch.device(DEVICE, torch.cuda.current_device())
    return SimpleNamespace(is_main_process=RANK == 0, device=dev)


def full_dict(ckpt_sd, model):
    """What Accelerate gets as full_sd: the weights on rank 0; elsewhere the (meta) model's."""
    return {k: v.clone() for k, v in ckpt_sd.items()} if RANK == 0 else model.state_dict()


def expect_device(policy, cpu_offload):
    """The placement table: CPU placements in host memory (pinned under a pinned CPU policy),
    accelerator placements on the mesh's device (host memory on a CPU mesh)."""
    cpu = cpu_offload if cpu_offload is not None else isinstance(policy, CPUOffloadPolicy)
    pinned = bool(cpu and isinstance(policy, CPUOffloadPolicy) and policy.pin_memory)
    return ("cpu" if cpu else DEVICE), pinned


def expect_rule(policy, cpu_offload):
    """The tri-state contract's row for every tensor: (device kind, rule)."""
    if cpu_offload is True:
        return "cpu", "cpu_offload=on"
    if cpu_offload is False:
        return "device", "cpu_offload=off"
    if isinstance(policy, CPUOffloadPolicy):
        return "cpu", "inferred: CPU offload policy"
    return "device", "inferred: no offload policy"


def snapshot(model):
    """name -> (placements, mesh, local shard) of every parameter."""
    out = {}
    for k, v in model.named_parameters():
        check(isinstance(v, DTensor), f"{k} is not a DTensor")
        out[k] = (v.placements, v.device_mesh, v.to_local().detach().clone(), v.to_local())
    return out


def compare(ref, b, label, policy, cpu_offload):
    pb = dict(b.named_parameters())
    check(list(ref) == list(pb), f"{label}: parameter names differ")
    dev, pinned = expect_device(policy, cpu_offload)
    for k, (placements, mesh, lx, live) in ref.items():
        y = pb[k]
        check(isinstance(y, DTensor), f"{label}: {k} not a DTensor")
        check(placements == y.placements and mesh == y.device_mesh, f"{label}: {k} placements differ")
        ly = y.to_local()
        check(lx.dtype == ly.dtype and lx.shape == ly.shape, f"{label}: {k} {lx.dtype}{tuple(lx.shape)} vs {ly.dtype}{tuple(ly.shape)}")
        check(torch.equal(lx.contiguous().view(torch.uint8), ly.contiguous().view(torch.uint8)),
              f"{label}: {k} local shard bytes differ")
        check(ly.device.type == dev and live.device.type == dev, f"{label}: {k} on {ly.device}, the table says {dev}")
        if torch.cuda.is_available():
            check(ly.is_pinned() == pinned, f"{label}: {k} pinned={ly.is_pinned()}, the table says {pinned}")


def sgd_step(model, seed=7):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(seed)
    ids = torch.randint(0, 37, (2, 5)).to(DEVICE)
    loss = model(ids).float().pow(2).mean()
    loss.backward()
    opt.step()
    return {k: v.to_local().detach().clone() for k, v in model.named_parameters()}


def trainable(policy, on_cpu):
    """Whether FSDP2 trains shards placed on the CPU (ON_CPU) or on the mesh's device under POLICY.
    On an accelerator mesh it refuses those whose placement contradicts the policy: device shards
    under a CPUOffloadPolicy (lazy_init: "FSDP parameters should be materialized on CPU when
    enabling CPU offloading"), host shards without one (the all-gather runs on the device). Both
    functions place them so when asked (cpu_offload=True without a policy, False with one); on a
    CPU mesh both places are host memory and every combination trains."""
    return DEVICE == "cpu" or on_cpu == isinstance(policy, CPUOffloadPolicy)


def equivalence(tmp, ckpt_sd, ckpt_dir, dtype, policies, calls, forms):
    from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict as accelerate_load
    runs = untrained = 0
    for policy in policies:
        refs = {}
        for call in calls:
            cpu_offload = call[1] if call[0] == "kw" else None
            ref_bool = cpu_offload if cpu_offload is not None else isinstance(policy, CPUOffloadPolicy)
            if ref_bool not in refs:  # Accelerate's function, called as its own prepare calls it
                ref = build(policy, dtype)
                accelerate_load(accel(), ref, full_dict(ckpt_sd, ref), cpu_offload=ref_bool)
                # the shards are compared either way; the step only where FSDP2 can take one
                refs[ref_bool] = (snapshot(ref), sgd_step(ref) if trainable(policy, ref_bool) else None)
            loaded, stepped = refs[ref_bool]
            for form in forms:
                label = f"dtype={dtype} policy={policy} call={call} form={form}"
                m = build(policy, dtype)
                full = ckpt_dir if form == "path" else full_dict(ckpt_sd, m)
                if call[0] == "legacy":
                    out = sla.fsdp2_load_full_state_dict(accel(), m, full)
                else:
                    out = sla.fsdp2_load_full_state_dict(accel(), m, full, cpu_offload=call[1])
                check(out is m, f"{label}: returns the model")
                want_rule = expect_rule(policy, cpu_offload)
                for k, r in sla.last_load_report().items():
                    check((r["placed"], r["rule"]) == want_rule, f"{label}: {k} placed {r['placed']} by "
                          f"'{r['rule']}', the contract says {want_rule}")
                compare(loaded, m, label, policy, cpu_offload)
                runs += 1
                if stepped is None:
                    untrained += 1
                    continue
                after = sgd_step(m)
                for k in after:
                    check(torch.isfinite(after[k].float()).all(), f"{label}: {k} not finite after a step")
                    check(torch.equal(stepped[k], after[k]), f"{label}: {k} differs from Accelerate's after a step")
    if RANK == 0:
        print(f"equivalence dtype={dtype}: {runs} drop-in loads ({len(policies)} policies x {len(calls)} calls x "
              f"{len(forms)} forms) bit-identical to Accelerate's, and after an SGD step"
              + (f" but for {untrained} whose placement contradicts the FSDP2 policy (skipped: FSDP2 refuses to "
                 f"train those on {DEVICE})" if untrained else ""), flush=True)


def expect_error(fn, *needles):
    try:
        fn()
    except shardload.ShardloadError as e:
        for n in needles:
            check(n in str(e), f"error should name {n!r}: {e}")
        return str(e)
    raise AssertionError(f"rank {RANK}: expected a ShardloadError naming {needles}")


def where_accelerate_fails(tmp, ckpt_sd):
    # a checkpoint in BF16 for an F32 model: Accelerate's non-main ranks receive into F32 buffers
    bf = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in ckpt_sd.items()}
    d = os.path.join(tmp, "bf16")
    if RANK == 0:
        save_sharded(bf, d)
    dist.barrier()
    for form in ("dict", "path"):
        m = build(None, torch.float32)
        sla.fsdp2_load_full_state_dict(accel(), m, d if form == "path" else (bf if RANK == 0 else None))
        full = {k: v.full_tensor() for k, v in m.state_dict().items()}
        for k, v in full.items():
            check(v.dtype == torch.float32, f"cast {form}: {k} is {v.dtype}")
            check(torch.equal(v.cpu(), bf[k].to(torch.float32)), f"cast {form}: {k} differs from the cast checkpoint")
    # a key missing from the checkpoint: one clear error on every rank, then the job goes on
    short = {k: v for k, v in ckpt_sd.items() if k != "model.norm.weight"}
    for form in ("dict", "path"):
        d = os.path.join(tmp, "short")
        if RANK == 0 and form == "path":
            save_sharded(short, d)
        dist.barrier()
        m = build(None)
        expect_error(lambda: sla.fsdp2_load_full_state_dict(accel(), m, d if form == "path" else (short if RANK == 0 else None)),
                     "model.norm.weight")
    # a key the model lacks: ignored, as Accelerate ignores it, even one shardload could not load
    extra = dict(ckpt_sd, **{"model.unused.weight": torch.ones(3), "model.unused.c": torch.zeros(2, dtype=torch.complex64)})
    m = build(None)
    sla.fsdp2_load_full_state_dict(accel(), m, extra if RANK == 0 else None, cpu_offload=None)
    full = {k: v.full_tensor() for k, v in m.state_dict().items()}
    check(all(torch.equal(full[k].cpu(), ckpt_sd[k]) for k in full), "extra key: loaded values differ")
    # checkpoint tensors whose shapes differ from their entries' (a sharded parameter one row
    # short, a plain buffer one longer; then one row longer and a 0-d buffer saved as [1]): one
    # error on every rank naming each entry and both shapes, as torch's "size mismatch", never
    # a DTensor that claims 37 rows and holds 36
    sdb = reference_state_dict(buffers=True)
    sdb["logit_scale"] = torch.tensor(0.75)
    sdb["position_ids"] = torch.arange(8, dtype=torch.int64) * 3
    wrong = [({"lm_head.weight": sdb["lm_head.weight"][:-1], "position_ids": torch.arange(9)},
              ["size mismatch for lm_head.weight", "[36, 16]", "[37, 16]", "size mismatch for position_ids", "[9]",
               "[8]", "2 of its tensors differ in shape"]),
             ({"model.embed_tokens.weight": torch.randn(38, 16), "logit_scale": torch.tensor([0.75])},
              ["size mismatch for model.embed_tokens.weight", "[38, 16]", "[37, 16]",
               "size mismatch for logit_scale", "[1]", "[]"])]
    for i, (changes, needles) in enumerate(wrong):
        bad_sd = dict(sdb, **changes)
        d = os.path.join(tmp, f"wrong-shape-{i}")
        if RANK == 0:
            save_sharded(bad_sd, d)
        dist.barrier()
        for form in ("dict", "path"):
            m = build(None, buffers=True)
            where = d if form == "path" else "full_sd"
            expect_error(lambda: sla.fsdp2_load_full_state_dict(accel(), m, d if form == "path" else
                                                                (bad_sd if RANK == 0 else None)),
                         *needles, where)
    # plain (non-DTensor) buffers, one 0-d: Accelerate reads .device_mesh of every entry
    d = os.path.join(tmp, "buffers")
    if RANK == 0:
        save_sharded(sdb, d)
    dist.barrier()
    for form in ("dict", "path"):
        m = build(CPUOffloadPolicy(pin_memory=False), buffers=True)
        sla.fsdp2_load_full_state_dict(accel(), m, d if form == "path" else (sdb if RANK == 0 else None))
        check(not isinstance(m.logit_scale, DTensor) and m.logit_scale.dim() == 0 and m.logit_scale.item() == 0.75,
              f"buffers {form}: 0-d buffer {m.logit_scale}")
        check(torch.equal(m.position_ids.cpu(), sdb["position_ids"]), f"buffers {form}: int64 buffer")
        # not FSDP2 parameters: on the mesh's device whatever the policy, as fully_shard keeps buffers
        check(m.position_ids.device.type == DEVICE and m.logit_scale.device.type == DEVICE,
              f"buffers {form}: buffers on {m.position_ids.device}, want {DEVICE}")
        r = sla.last_load_report()
        check(r["position_ids"]["placed"] == "device" and r["model.norm.weight"]["placed"] == "cpu",
              f"buffers {form}: report {r['position_ids']} / {r['model.norm.weight']}")
        sgd_step(m)
    # rank 0's argument decides the form: a path there, None elsewhere
    m = build(None)
    sla.fsdp2_load_full_state_dict(accel(), m, os.path.join(tmp, "bf16") if RANK == 0 else None)
    check(m.lm_head.weight.to_local().dtype == torch.float32, "rank 0's path form: loaded")
    # tied weights, the checkpoint without the tied copy (as save_pretrained writes it)
    tied = {k: v for k, v in ckpt_sd.items() if k != "lm_head.weight"}
    d = os.path.join(tmp, "tied")
    if RANK == 0:
        save_sharded(tied, d)
    dist.barrier()
    for form in ("dict", "path"):
        m = build(None, tied=True)
        sla.fsdp2_load_full_state_dict(accel(), m, d if form == "path" else (tied if RANK == 0 else None))
        check(sla.last_load_report()["lm_head.weight"].get("alias_of") == "model.embed_tokens.weight",
              f"tied {form}: lm_head.weight not taken from its alias")
        check(torch.equal(m.lm_head.weight.full_tensor().cpu(), tied["model.embed_tokens.weight"]), f"tied {form}: values")
    # ranks whose models differ (rank 1's has an extra buffer): one error on every rank, naming it
    if WORLD > 1:
        m = build(None, buffers=RANK == WORLD - 1)
        expect_error(lambda: sla.fsdp2_load_full_state_dict(accel(), m, os.path.join(tmp, "bf16")),
                     f"rank {WORLD - 1}'s model.state_dict() differs from rank 0's")
    # a dict entry that is not a tensor
    m = build(None)
    bad = dict(ckpt_sd, **{"model.norm.weight": "not a tensor"})
    expect_error(lambda: sla.fsdp2_load_full_state_dict(accel(), m, bad if RANK == 0 else None),
                 "model.norm.weight", "rank 0")
    if RANK == 0:
        print("where Accelerate fails: dtype cast, missing key, extra key, plain/0-d buffers, tied weights, bad entry: ok", flush=True)


def hsdp(ckpt_dir, ckpt_sd):
    """2-D meshes (HSDP: [Replicate, Shard(0)]): the plan's mesh is the DTensors' mesh."""
    from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict as accelerate_load
    shapes = [(WORLD, 1), (1, WORLD)]
    for shape in shapes:
        ref = build(None, mesh_shape=shape)
        accelerate_load(accel(), ref, full_dict(ckpt_sd, ref), cpu_offload=False)
        loaded = snapshot(ref)
        for form in ("dict", "path"):
            m = build(None, mesh_shape=shape)
            sla.fsdp2_load_full_state_dict(accel(), m, ckpt_dir if form == "path" else full_dict(ckpt_sd, m))
            compare(loaded, m, f"hsdp mesh {shape} {form}", None, None)
    if RANK == 0:
        print(f"2-D meshes {shapes}: bit-identical to Accelerate's", flush=True)


def accelerate_prepare(ckpt_sd):
    """Accelerate's own FSDP2 preparation (fsdp2_prepare_model with cpu_ram_efficient_loading,
    which calls fsdp2_load_full_state_dict with rank 0's state dict and cpu_offload=isinstance(
    policy, CPUOffloadPolicy)): once as shipped, once after patch(); the same shards."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    import accelerate.utils.fsdp_utils as fu

    def run(patched, policy):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True, cpu_offload=policy,
                                                auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["Block"])
        mesh = init_device_mesh(DEVICE, (WORLD,), mesh_dim_names=("dp_shard",))
        a = accel()
        acc = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=mesh,
                              parallelism_config=SimpleNamespace(fsdp_dim_names=["dp_shard"]),
                              device=a.device, is_main_process=a.is_main_process, mixed_precision="no")
        torch.manual_seed(100 + RANK)  # the other ranks' weights must not matter
        m = ToyLlama()
        if RANK == 0:
            m.load_state_dict(ckpt_sd)
        m = m.to(a.device)
        if patched:
            sla.patch()
        try:
            m = fu.fsdp2_prepare_model(acc, m)
        finally:
            sla.unpatch()
        return snapshot(m), m

    for policy in (False, CPUOffloadPolicy(pin_memory=False)):
        sla._report.clear()
        ref, _ = run(False, policy)
        check(not sla.last_load_report(), "unpatched prepare went through the drop-in")
        _, m = run(True, policy)
        compare(ref, m, f"fsdp2_prepare_model policy={policy}", policy or None, bool(policy))
        rep = sla.last_load_report()
        check(len(rep) == len(ref), f"patched prepare: the drop-in loaded {len(rep)} of {len(ref)} entries")
    if RANK == 0:
        print("Accelerate's fsdp2_prepare_model, as shipped and patched: bit-identical", flush=True)


def in_place(ckpt_dir, ckpt_sd):
    """A materialised model (not meta): the shards land in the parameters' own local storage."""
    torch.manual_seed(99)
    m = ToyLlama()
    mesh = init_device_mesh(DEVICE, (WORLD,))
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    before = {k: v.to_local().data_ptr() for k, v in m.named_parameters()}
    sla.fsdp2_load_full_state_dict(accel(), m, ckpt_dir)
    rep = sla.last_load_report()
    for k, v in m.named_parameters():
        check(rep[k]["in_place"], f"in place: {k} was not loaded into the parameter's storage")
        check(v.to_local().data_ptr() == before[k], f"in place: {k} moved to new storage")
    full = {k: v.full_tensor() for k, v in m.state_dict().items()}
    check(all(torch.equal(full[k].cpu(), ckpt_sd[k]) for k in full), "in place: values differ")
    sgd_step(m)
    if RANK == 0:
        print("in place into a materialised model's parameters: ok", flush=True)


def patching(tmp, ckpt_dir, ckpt_sd):
    import accelerate.utils as au
    import accelerate.utils.fsdp_utils as fu
    original = fu.fsdp2_load_full_state_dict
    sla.patch()
    check(fu.fsdp2_load_full_state_dict is sla.fsdp2_load_full_state_dict, "patch: fsdp_utils")
    check(au.fsdp2_load_full_state_dict is sla.fsdp2_load_full_state_dict, "patch: accelerate.utils")
    # what Accelerate's fsdp2_prepare_model does: a name lookup in fsdp_utils, keyword form
    m = build(CPUOffloadPolicy(pin_memory=False))
    fu.fsdp2_load_full_state_dict(accel(), m, ckpt_dir, cpu_offload=True)
    full = {k: v.full_tensor() for k, v in m.state_dict().items()}
    check(all(torch.equal(full[k].cpu(), ckpt_sd[k]) for k in full), "patched load: values differ")
    sla.unpatch()
    check(fu.fsdp2_load_full_state_dict is original and au.fsdp2_load_full_state_dict is original, "unpatch")
    if RANK == 0:
        print("patch/unpatch: ok", flush=True)


def main():
    global RANK, WORLD, DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--device", default="cpu", help="the meshes' device type (cuda on a GPU machine)")
    a = ap.parse_args()
    DEVICE = a.device
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("gloo" if DEVICE == "cpu" else f"cpu:gloo,{DEVICE}:nccl")
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    tmp = os.path.join(a.tmp, f"w{WORLD}")
    try:
        policies = [None, CPUOffloadPolicy(pin_memory=False)]
        if torch.cuda.is_available():
            policies.append(CPUOffloadPolicy(pin_memory=True))
        elif RANK == 0:
            print("no CUDA: CPUOffloadPolicy(pin_memory=True) is left out here (FSDP2's reset_sharded_param "
                  "pins the loaded shards, which needs CUDA, for Accelerate's function as for the drop-in); "
                  "bench/gpu-check.sh runs it", flush=True)
        calls = [("kw", True), ("kw", False), ("kw", None), ("legacy",)]
        for dtype in (torch.float32, torch.bfloat16):
            sd = reference_state_dict(dtype=dtype)
            d = os.path.join(tmp, f"ckpt-{str(dtype)[6:]}")
            if RANK == 0:
                save_sharded(sd, d)
            dist.barrier()
            if dtype == torch.float32:
                equivalence(tmp, sd, d, dtype, policies, calls, ["dict", "path"])
            else:  # BF16: every policy, the inferring calls, both forms
                equivalence(tmp, sd, d, dtype, policies, [("kw", None), ("legacy",)], ["dict", "path"])
        sd = reference_state_dict()
        where_accelerate_fails(tmp, sd)
        hsdp(os.path.join(tmp, "ckpt-float32"), sd)
        in_place(os.path.join(tmp, "ckpt-float32"), sd)
        patching(tmp, os.path.join(tmp, "ckpt-float32"), sd)
        accelerate_prepare(sd)
        r = next(iter(sla.last_load_report().values()))
        if RANK == 0:
            print(f"backend {r['backend']}, collective {r['collective']}", flush=True)
        from shardload import _dlpack
        check(_dlpack.live_count() == 0, f"{_dlpack.live_count()} DLPack exports never released")
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # the others fail by their own timeouts/errors; never hang in teardown
    dist.barrier()
    if RANK == 0:
        print(f"test_accelerate_equiv world {WORLD}: {CHECKS} checks on rank 0 passed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
