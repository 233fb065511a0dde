"""A small Hugging Face-layout decoder (Llama naming) for the tests and the benchmark, and a
checkpoint writer in the HF sharded layout (model-0000K-of-0000N.safetensors + index.json)."""

from __future__ import annotations

import json
import os

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.self_attn = nn.Module()
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self.self_attn, n, nn.Linear(h, h, bias=False))
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, 3 * h, bias=False)
        self.mlp.up_proj = nn.Linear(h, 3 * h, bias=False)
        self.mlp.down_proj = nn.Linear(3 * h, h, bias=False)
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        a = self.self_attn
        x = x * self.input_layernorm.weight
        x = x + a.o_proj(a.q_proj(x) * torch.sigmoid(a.k_proj(x)) + a.v_proj(x))
        m = self.mlp
        return x + m.down_proj(torch.nn.functional.silu(m.gate_proj(x)) * m.up_proj(x))


class ToyLlama(nn.Module):
    """model.embed_tokens, model.layers.N.*, model.norm, lm_head; vocab need not divide the world."""

    def __init__(self, vocab: int = 37, h: int = 16, layers: int = 2, buffers: bool = False):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, h)
        self.model.layers = nn.ModuleList(Block(h) for _ in range(layers))
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.ones(h))
        self.lm_head = nn.Linear(h, vocab, bias=False)
        if buffers:  # plain (non-DTensor) persistent buffers, one of them 0-d
            self.register_buffer("logit_scale", torch.tensor(1.0))
            self.register_buffer("position_ids", torch.arange(8, dtype=torch.int64))

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        x = x * self.model.norm.weight
        out = self.lm_head(x)
        if hasattr(self, "logit_scale"):
            out = out * self.logit_scale
        return out


def reference_state_dict(vocab=37, h=16, layers=2, dtype=torch.float32, seed=1234, buffers=False):
    torch.manual_seed(seed)
    m = ToyLlama(vocab, h, layers, buffers)
    sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    for k, v in sd.items():
        if v.is_floating_point():
            sd[k] = (v + 0.01 * torch.randn_like(v)).to(dtype)  # norms too: not all ones
    return sd


def save_sharded(sd: dict, directory: str, shards: int = 2) -> str:
    """HF layout: model-0000K-of-0000N.safetensors files and model.safetensors.index.json."""
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    keys = list(sd)
    per = (len(keys) + shards - 1) // shards
    weight_map = {}
    total = 0
    for s in range(shards):
        part = keys[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: sd[k].contiguous() for k in part}, os.path.join(directory, fname), metadata={"format": "pt"})
        for k in part:
            weight_map[k] = fname
            total += sd[k].numel() * sd[k].element_size()
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return directory
