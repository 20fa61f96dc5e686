"""dumps.py: verl's JSONL fields, row alignment with the trained batch, extras of the wrong length
left out; plus the small signals/profiling helpers the trainer wires next to them."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

from dapo.batch import Batch
from dapo.outputs.dumps import dump_batch, dump_generations
from runs import jsonl_rows

torch.set_num_threads(1)


def test_fields_and_extras(tmp_path):
    path, dropped = dump_generations(
        tmp_path / "rollouts",
        7,
        inputs=["1+1=", "2+2="],
        outputs=["2", "5 ü"],
        gts=["2", None],
        scores=[1.0, np.float32(-1.0)],
        reward_extra_infos={
            "acc": [True, np.bool_(False)],
            "pred": ["2", "5"],
            "score": [0.5, 0.0],  # overwrites the base key, as verl does
            "round_metric": [1.0],  # wrong length: left out and reported
        },
    )
    assert path == tmp_path / "rollouts" / "7.jsonl"
    assert dropped == ["round_metric"]
    assert "ü" in path.read_text(encoding="utf-8")  # ensure_ascii=False
    assert jsonl_rows(path) == [
        {"input": "1+1=", "output": "2", "gts": "2", "score": 0.5, "step": 7, "acc": True, "pred": "2"},
        {"input": "2+2=", "output": "5 ü", "gts": None, "score": 0.0, "step": 7, "acc": False, "pred": "5"},
    ]
    # a second dump of the same step overwrites (mode "w", as verl)
    dump_generations(tmp_path / "rollouts", 7, ["a"], ["b"], [None], [float("nan")], {})
    assert jsonl_rows(path) == [{"input": "a", "output": "b", "gts": None, "score": None, "step": 7}]
    assert sorted(os.listdir(tmp_path / "rollouts")) == ["7.jsonl"]


def test_length_mismatch_of_base_columns_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="scores has 1 rows, inputs has 2"):
        dump_generations(tmp_path, 1, ["a", "b"], ["c", "d"], [None, None], [1.0], {})


def test_dump_batch_rows_stay_aligned_after_filtering(tmp_path, char_tokenizer):
    tok = char_tokenizer
    pad = tok.pad_token_id

    def enc(s, width, left):
        ids = tok.encode(s, add_special_tokens=False)
        fill = [pad] * (width - len(ids))
        return fill + ids if left else ids + fill

    prompts = ["1+1=", "3+4=", "9+0=", "2+5="]
    responses = ["2", "8", "9", "7"]
    acc = [True, False, True, True]
    batch = Batch(
        tensors={
            "prompts": torch.tensor([enc(p, 6, True) for p in prompts]),
            "responses": torch.tensor([enc(r, 3, False) for r in responses]),
            "token_level_scores": torch.tensor([[0.0, 0.0, 1.0 if a else -1.0] for a in acc]),
        },
        non_tensors={
            "reward_model": [{"ground_truth": g} for g in ["2", "7", "9", "7"]],
            "acc": acc,
            "pred": responses,
        },
    )
    # the trained batch is a filtered, reordered selection: its own columns travel with it
    trained = batch.select([3, 0, 1])
    path, dropped = dump_batch(tmp_path, 2, trained, tok, reward_extra_keys=["acc", "pred", "absent"])
    assert dropped == []
    rows = jsonl_rows(path)
    assert [(r["input"], r["output"], r["gts"], r["score"], r["acc"], r["pred"]) for r in rows] == [
        ("2+5=", "7", "7", 1.0, True, "7"),
        ("1+1=", "2", "2", 1.0, True, "2"),
        ("3+4=", "8", "7", -1.0, False, "8"),
    ]
    for r in rows:
        assert r["output"] == r["pred"]  # aligned row by row


def test_graceful_stop_sets_flag_then_second_ctrl_c_raises():
    from dapo.trainer.signals import GracefulStop

    before_int = signal.getsignal(signal.SIGINT)
    before_term = signal.getsignal(signal.SIGTERM)
    said = []
    with GracefulStop(said.append) as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM does not abort
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert "SIGTERM: finishing the current step" in said[0]
    assert signal.getsignal(signal.SIGINT) is before_int
    assert signal.getsignal(signal.SIGTERM) is before_term
    with GracefulStop(None) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signal == signal.SIGINT


def test_profile_step_writes_chrome_trace_only_for_chosen_steps(tmp_path):
    from dapo.outputs.profiling import profile_step

    for step in (1, 2):
        with profile_step(step, [2], tmp_path) as trace:
            torch.ones(8, 8) @ torch.ones(8, 8)
        assert (trace is None) == (step == 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2.json"]
    events = json.loads((tmp_path / "step_2.json").read_text())["traceEvents"]
    assert any("mm" in e.get("name", "") for e in events)


def test_flops_per_token_hand_computed():
    from dapo.outputs.profiling import batch_flops, estimate_mfu, flops_per_token, peak_memory_gb

    cfg = {
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 16,
        "vocab_size": 10,
    }
    # per layer: q 8*8 + k,v 2*8*4 + o 8*8 = 192; mlp 3*8*16 = 384 -> 576 * 2 layers = 1152
    # embedding + lm head 2*10*8 = 160 -> N = 1312
    assert flops_per_token(cfg) == 6 * 1312
    assert flops_per_token(cfg, seq_len=5) == 6 * 1312 + 12 * 2 * 8 * 5
    assert batch_flops(cfg, [3, 5]) == 6 * 1312 * 8 + 12 * 2 * 8 * (9 + 25)
    assert estimate_mfu(cfg, [3, 5], seconds=2.0, peak_flops=1e6) == pytest.approx(
        batch_flops(cfg, [3, 5]) / 2e6
    )
    assert estimate_mfu(cfg, [3, 5], seconds=2.0, peak_flops=None) is None or torch.cuda.is_available()
    assert 0.001 < peak_memory_gb("cpu") < 1024


def test_flops_from_a_real_hf_config(tiny_random_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    from dapo.outputs.profiling import matmul_params

    cfg = AutoConfig.from_pretrained(tiny_random_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_random_model_dir)
    p = matmul_params(cfg)
    linear = sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and "lm_head" not in n
    )
    assert p["layers"] == linear
