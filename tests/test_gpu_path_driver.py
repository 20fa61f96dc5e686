"""Hugging Face files written from pieces of rows, byte for byte what ``save_pretrained`` writes."""

from __future__ import annotations

import filecmp
import os

import pytest
import torch
from safetensors.torch import save_file

from dapo.bench.weight_sync import save_random_model, trainable_bytes
from dapo.checkpoint.stream_safetensors import StreamedSafetensors, save_pretrained_streamed
from dapo.model.loader import load_model, load_model_layout

BUCKET_MB = 8
PAD, EOS = 0, 2047


def _pieces(model: torch.nn.Module, parts: int = 3) -> list[tuple[str, int, torch.Tensor]]:
    """Every parameter cut into up to ``parts`` blocks of rows, as ranks send them."""
    out = []
    for n, p in model.named_parameters():
        t = p.detach()
        if t.dim() == 0:
            out.append((n, 0, t))
            continue
        step = max(1, -(-t.shape[0] // parts))
        out += [(n, s, t[s : s + step]) for s in range(0, t.shape[0], step)]
    return out


def test_gpu_path_streamed_safetensors_equals_save_file(tmp_path):
    """Blocks of rows written out of order, several per tensor, make the file save_file writes
    (mixed dtypes, a 0-dim and a 1-dim tensor, an empty one); a block that does not fit and a
    tensor left incomplete are refused, naming the tensor."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(7, 5, generator=g),
        "b": torch.randn(9, generator=g).to(torch.bfloat16),
        "scale": torch.tensor(1.5),
        "ids": torch.arange(6, dtype=torch.int64).reshape(3, 2),
        "none": torch.zeros(0, 4),
        "z.weight": torch.randn(4, 3, 2, generator=g).to(torch.float16),
    }
    ref = tmp_path / "ref.safetensors"
    save_file(tensors, str(ref), metadata={"format": "pt"})
    blocks = [
        ("z.weight", 2, tensors["z.weight"][2:]),
        ("w", 4, tensors["w"][4:]),
        ("b", 3, tensors["b"][3:]),
        ("scale", 0, tensors["scale"]),
        ("w", 0, tensors["w"][:2]),
        ("ids", 0, tensors["ids"]),
        ("b", 0, tensors["b"][:3]),
        ("w", 2, tensors["w"][2:4]),
        ("z.weight", 0, tensors["z.weight"][:2].float()),  # cast to the file's dtype
    ]
    out = tmp_path / "out.safetensors"
    w = StreamedSafetensors(out, {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}, {"format": "pt"})
    for name, start, rows in blocks:
        w.write_rows(name, start, rows)
    w.close()
    assert out.read_bytes() == ref.read_bytes()

    w = StreamedSafetensors(tmp_path / "bad.safetensors", {"w": (torch.float32, (7, 5))})
    with pytest.raises(ValueError, match=r"w rows 6\+\(2, 5\) do not fit its shape \(7, 5\)"):
        w.write_rows("w", 6, torch.zeros(2, 5))
    w.write_rows("w", 0, torch.zeros(6, 5))
    with pytest.raises(ValueError, match=r"1 tensors incomplete, e.g. \['w'\]"):
        w.close()


def test_gpu_path_streamed_model_dir_equals_save_pretrained(tmp_path):
    """A layout model (parameters on meta) and the weights as pieces write the directory
    save_pretrained writes for the real model, file for file: config, generation config, the
    tied embedding kept once under the name save_pretrained keeps, and with a small shard size
    the same shards and index."""
    src = save_random_model(tmp_path / "src", "tied-table")
    full = load_model(src)
    layout = load_model_layout(src)
    assert all(p.is_meta for p in layout.parameters())
    for kw in ({}, {"max_shard_size": "8MB"}):
        ref, out = tmp_path / f"ref{len(kw)}", tmp_path / f"out{len(kw)}"
        full.save_pretrained(ref, safe_serialization=True, **kw)
        pieces = _pieces(full)[::-1]
        n = save_pretrained_streamed(layout, out, pieces, **kw)
        assert n == trainable_bytes(full)
        names = sorted(os.listdir(ref))
        assert names == sorted(os.listdir(out)) and len(names) >= 3
        if kw:
            assert "model.safetensors.index.json" in names
        for f in names:
            assert filecmp.cmp(ref / f, out / f, shallow=False), f
    assert all(p.is_meta for p in layout.parameters())
