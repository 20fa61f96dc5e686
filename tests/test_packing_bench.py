"""The bench helpers: RL-like batch shape, interleaved median ratios, CLI registration."""

import argparse

import torch

from dapo.bench.common import interleaved
from dapo.bench.rollout import _response_tokens
from dapo.bench.rollout import register as register_rollout
from dapo.bench.update import register as register_update
from dapo.bench.update import rl_batch


def test_rl_batch_lengths_vary_and_masks_are_consistent():
    b = rl_batch(64, 24, 96, vocab=103, seed=1)
    attn, rmask = b.tensors["attention_mask"], b.tensors["response_mask"]
    r_len = rmask.sum(-1)
    assert attn.shape == (64, 120) and torch.equal(attn[:, 24:], rmask)
    assert int(r_len.min()) >= 1 and int(r_len.max()) == 96 and float(r_len.float().std()) > 10
    assert 0.3 < 1 - float(attn.float().mean()) < 0.8  # a good share of padding to save
    assert ((b.tensors["input_ids"] != 0) == attn.bool()).all()


def test_interleaved_reports_median_ratio():
    calls = []

    def ours():
        calls.append("o")
        return 10.0

    def base():
        calls.append("b")
        return 5.0

    res = interleaved(ours, base, 3)
    assert calls == ["o", "b", "b", "o", "o", "b"]  # order flips every round
    assert len(res["ratios"]) == 3 and res["speedup"] > 0


def test_response_tokens_count_up_to_eos():
    gen = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    assert _response_tokens(gen, [2]) == 2 + 4 + 1


def test_register_adds_commands_with_json_flag():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="bench")
    register_rollout(sub)
    register_update(sub)
    a = parser.parse_args(["rollout", "--json", "--models", "tiny"])
    assert a.json and a.models == ["tiny"] and callable(a.func)
    a = parser.parse_args(["update", "--json"])
    assert a.json and a.models == ["tiny", "qwen2-100m"]
