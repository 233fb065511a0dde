"""shardload.torch.load_model in one process (no torch.distributed): tied weights stay tied,
buffer dtypes, the device chosen for plain models, the load report. Real torch, real files."""

from __future__ import annotations

import pytest


@pytest.fixture()
def slt(torch):
    return pytest.importorskip("shardload.torch")


def _tied(torch):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(11, 4)
            self.mid = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 11, bias=False)
            self.head.weight = self.emb.weight
    return Tied()


def test_tied_weights_stay_tied(torch, slt, tmp_path):
    save_model = pytest.importorskip("safetensors.torch").save_model
    torch.manual_seed(3)
    src = _tied(torch)
    path = str(tmp_path / "tied.safetensors")
    save_model(src, path)  # the tie saved once, as safetensors does
    m = _tied(torch)
    assert slt.load_model(m, path) == ([], [])
    assert m.head.weight is m.emb.weight
    assert len(list(m.parameters())) == 3  # emb (= head), mid.weight, mid.bias
    assert torch.equal(m.emb.weight, src.emb.weight)
    # a step through the one Parameter updates both names
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    m.head(m.mid(m.emb(torch.tensor([1, 2])))).sum().backward()
    opt.step()
    assert not torch.equal(m.emb.weight, src.emb.weight)
    assert m.head.weight is m.emb.weight and torch.equal(m.head.weight, m.emb.weight)


class _On:
    """A stand-in state-dict value on DEVICE: _model_device reads only .device, and this
    machine may have no accelerator to put a real tensor on."""

    def __init__(self, device):
        self.device = device


def _entries(slt, *values):
    return [slt._Entry(f"t{i}", v) for i, v in enumerate(values)]


def test_plain_model_loads_onto_its_own_device(torch, slt):
    cuda1 = torch.device("cuda", 1)
    assert slt._model_device(_entries(slt, _On(cuda1), _On(cuda1))) == ("cuda", cuda1)
    assert slt._local_device("cuda", cuda1) == cuda1  # not the current device, not the CPU
    assert slt._model_device(_entries(slt, torch.zeros(2))) == ("cpu", torch.device("cpu"))
    assert slt._model_device(_entries(slt, torch.empty(2, device="meta"))) == ("cpu", None)


def test_plain_model_on_two_devices_refused(torch, slt):
    with pytest.raises(ValueError, match=r"several devices \['cpu', 'cuda:1'\].*model.to"):
        slt._model_device(_entries(slt, torch.zeros(2), _On(torch.device("cuda", 1))))


def test_report_names_the_tensors_device(torch, slt, tmp_path):
    save_model = pytest.importorskip("safetensors.torch").save_model
    src = _tied(torch)
    path = str(tmp_path / "tied.safetensors")
    save_model(src, path)
    m = _tied(torch)
    slt.load_model(m, path)
    rep = slt.last_load_report()
    assert rep["mid.weight"]["device"] == str(m.mid.weight.device) == "cpu"
    assert rep["mid.weight"]["placed"] in ("cpu", "device")


def _counts(torch):
    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 2)
            self.register_buffer("ids", torch.zeros(4, dtype=torch.int32))
            self.register_buffer("mask", torch.zeros(3, dtype=torch.bool))
    return Counts()


def test_integer_buffers_keep_the_models_dtype(torch, slt, tmp_path):
    save_file = pytest.importorskip("safetensors.torch").save_file
    m = _counts(torch)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    sd["ids"] = torch.tensor([5, -7, 2**31 - 1, 0], dtype=torch.int64)  # int64 on disk, fits int32
    sd["mask"] = torch.tensor([1, 0, 1], dtype=torch.uint8)
    path = str(tmp_path / "counts.safetensors")
    save_file(sd, path)
    slt.load_model(m, path)
    assert m.ids.dtype == torch.int32 and m.ids.tolist() == [5, -7, 2**31 - 1, 0]
    assert m.mask.dtype == torch.bool and m.mask.tolist() == [True, False, True]


def test_integer_values_that_do_not_fit_refused(torch, slt, tmp_path):
    save_file = pytest.importorskip("safetensors.torch").save_file
    m = _counts(torch)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    sd["ids"] = torch.tensor([1, 2**40, 3, 4], dtype=torch.int64)
    path = str(tmp_path / "big.safetensors")
    save_file(sd, path)
    with pytest.raises(Exception, match=r"'ids'.*I64.*do not fit.*torch.int32"):
        slt.load_model(m, path)


def test_offload_policy_subclass_is_an_offload_policy(torch, slt):
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    class Mine(CPUOffloadPolicy):
        pass
    assert slt._policy_key(Mine(pin_memory=False)) == "cpu"
    assert slt._policy_key(Mine()) == "cpu-pinned"
    assert slt._policy_key(OffloadPolicy()) == "none" and slt._policy_key(None) == "none"


def test_fsdp2_from_the_private_module_before_torch_2_6(torch, slt, monkeypatch):
    import torch.distributed._composable.fsdp as private
    import torch.distributed.fsdp as public
    want = (private.FSDPModule, private.CPUOffloadPolicy)
    monkeypatch.delattr(public, "FSDPModule")  # as torch 2.4/2.5 export it: not from here
    monkeypatch.delattr(public, "CPUOffloadPolicy")
    assert slt._fsdp2() == want
    monkeypatch.delattr(private, "FSDPModule")
    with pytest.raises(ImportError, match=r"no FSDP2.*torch >= 2.4"):
        slt._fsdp2()  # never "no policy"


def test_progress_callback_of_load_model(torch, slt, tmp_path):
    save_model = pytest.importorskip("safetensors.torch").save_model
    src = _tied(torch)
    path = str(tmp_path / "tied.safetensors")
    save_model(src, path)
    seen = []
    slt.load_model(_tied(torch), path, progress=lambda *a: seen.append(a))
    assert seen and seen[-1][0] == seen[-1][1] > 0 and seen[-1][2] == seen[-1][3] == 3, seen
    with pytest.raises(TypeError, match="progress must be a callable"):
        slt.load_model(_tied(torch), path, progress="yes")
