"""The multi-turn tool loop: masks, turn limits, budget, truncation sides, malformed calls."""

from __future__ import annotations

import pytest
import torch

from dapo.rollout.hf import SamplingParams
from dapo.rollout.multiturn import MultiTurnRollout, MultiTurnSettings, multiturn_metrics, truncate_tool_text
from dapo.tools import CalculatorTool, Gsm8kTool
from dapo.tools.parser import format_hermes_call
from fixtures.config_helpers import config_problems
from fixtures.multiturn_helpers import CALL, TOK, calc_then_answer, rollout, rows, text

torch.set_num_threads(1)


def test_two_turn_sample_masks_tool_tokens_zero():
    mt, eng, out, info = rollout(calc_then_answer, n=2)
    call_ids = TOK(CALL, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    tool_ids = TOK("<|tool|>1776<|end|><|assistant|>", add_special_tokens=False)["input_ids"]
    answer_ids = TOK("Answer: 1776", add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    want = call_ids + tool_ids + answer_ids
    want_mask = [1] * len(call_ids) + [0] * len(tool_ids) + [1] * len(answer_ids)
    for row in range(2):
        assert out.responses[row, : len(want)].tolist() == want
        assert out.response_mask[row].tolist() == want_mask + [0] * (200 - len(want))
        # attention covers the tool tokens too; log-probs are zero off the mask
        assert out.attention_mask[row, 64:].tolist() == [1] * len(want) + [0] * (200 - len(want))
        assert torch.all(out.rollout_log_probs[row][out.response_mask[row] == 0] == 0)
        assert torch.all(out.rollout_log_probs[row][out.response_mask[row] == 1] == -0.5)
    prompt = TOK.apply_chat_template(
        rows()[0]["raw_prompt"],
        tools=[CalculatorTool().tool_schema],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt.startswith("<|system|>tools: calculator(expression)<|end|>")
    assert text(out.prompts[0]) == prompt
    assert out.attention_mask[0, :64].sum() == len(TOK(prompt, add_special_tokens=False)["input_ids"])
    assert info["num_turns"] == [4, 4]  # 2 assistant + 1 tool turn + 1, as verl counts
    assert info["tool_call_counts"] == [1, 1]
    assert [m["role"] for m in info["messages"][0]] == ["assistant", "tool", "assistant"]
    assert info["messages"][0][1]["content"] == "1776"
    assert not out.truncated.any()
    # first turn: one call with n samples; second turn: each trajectory continues alone
    assert eng.calls[0] == (2, 200) and eng.calls[1][0] == 2
    m = mt.last_metrics
    assert m["num_turns/mean"] == 4 and m["tool_call_counts/max"] == 1 and m["tools/call_rate"] == 1.0
    assert m["tools/calls"] == 2 and m["tools/malformed"] == 0


def test_no_call_ends_after_one_turn():
    _, eng, out, info = rollout(lambda ctx: "Answer: 5")
    assert info["num_turns"] == [2] and info["tool_call_counts"] == [0]
    assert out.response_mask[0].sum() == len("Answer: 5") + 1
    assert len(eng.calls) == 1


@pytest.mark.parametrize(
    ("reply", "kind", "says"),
    [
        ("<tool_call>{not json}</tool_call>", "malformed", "not valid JSON"),
        ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown_tool", "unknown tool 'nope'"),
        (format_hermes_call("calculator", {"expr": "1+1"}), "bad_arguments", "missing required"),
        (format_hermes_call("calculator", {"expression": 12}), "bad_arguments", "must be a string"),
        (format_hermes_call("calculator", {"expression": "__import__('os')"}), "tool_error", "unsupported"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}', "malformed", "not closed"),
    ],
)
def test_malformed_calls_become_error_messages_and_are_counted(reply, kind, says):
    def policy(ctx):
        return reply if "<|tool|>" not in ctx else "Answer: 0"

    mt, _, out, info = rollout(policy)
    tool_msg = info["messages"][0][1]
    assert (
        tool_msg["role"] == "tool" and tool_msg["content"].startswith("Error") and says in tool_msg["content"]
    )
    assert mt.last_metrics[f"tools/{kind}"] == 1
    assert info["tool_errors"] == [1] and info["num_turns"] == [4]
    assert text(out.responses[0]).endswith("Answer: 0<|end|>")


def test_max_assistant_turns_stops_a_model_that_keeps_calling():
    _, eng, _, info = rollout(lambda ctx: CALL, MultiTurnSettings(max_assistant_turns=3))
    assert info["num_turns"] == [3 + 2 + 1] and info["tool_call_counts"] == [2]
    assert len(eng.calls) == 3


def test_max_user_turns_stops_before_running_more_tools():
    _, _, _, info = rollout(lambda ctx: CALL, MultiTurnSettings(max_user_turns=2))
    assert info["tool_call_counts"] == [2]
    assert info["num_turns"] == [3 + 2 + 1]


def test_response_budget_stops_the_loop_and_never_overflows():
    mt, _, out, info = rollout(lambda ctx: CALL, R=200)
    lengths = int(out.attention_mask[0, 64:].sum())
    assert lengths <= 200 and out.truncated[0]
    assert mt.last_metrics["tools/budget_stops"] + mt.last_metrics["tools/calls"] >= 1
    # a turn cut by the budget ends the trajectory as truncated
    _, _, out2, info2 = rollout(lambda ctx: "x" * 500, R=50)
    assert out2.response_mask[0].sum() == 50 and out2.truncated[0] and info2["num_turns"] == [2]


def test_parallel_calls_are_capped():
    two = CALL + format_hermes_call("calculator", {"expression": "2+2"}) + CALL

    def policy(ctx):
        return two if "<|tool|>" not in ctx else "Answer: 1776"

    mt, _, _, info = rollout(policy, MultiTurnSettings(max_parallel_calls=2), R=400)
    assert info["tool_call_counts"] == [2] and mt.last_metrics["tools/dropped_calls"] == 1
    assert [m["content"] for m in info["messages"][0][1:3]] == ["1776", "4"]


@pytest.mark.parametrize(
    ("side", "want"),
    [
        ("left", "abcd...(truncated)"),
        ("right", "(truncated)...ghij"),
        ("middle", "ab...(truncated)...ij"),
    ],
)
def test_truncation_sides(side, want):
    assert truncate_tool_text("abcdefghij", 4, side) == want
    assert truncate_tool_text("abcd", 4, side) == "abcd"


def test_tool_response_truncated_in_the_rollout():
    def policy(ctx):
        return (
            format_hermes_call("calculator", {"expression": "7**40"})
            if "<|tool|>" not in ctx
            else "Answer: 1"
        )

    mt, _, _, info = rollout(
        policy, MultiTurnSettings(max_tool_response_length=10, tool_response_truncate_side="right")
    )
    assert info["messages"][0][1]["content"] == "(truncated)..." + str(7**40)[-10:]
    assert mt.last_metrics["tools/response_truncated"] == 1


def test_per_sample_tools_kwargs_reach_create():
    def policy(ctx):
        if "<|tool|>" not in ctx:
            return format_hermes_call("calc_gsm8k_reward", {"answer": "1776"})
        return "#### 1776"

    extra = {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1776"}}}}
    _, _, _, info = rollout(policy, tools=[Gsm8kTool()], extra=extra)
    assert info["messages"][0][1]["content"] == "Current parsed answer='1776' reward=1.0"
    assert info["tool_rewards"] == [0.0]


def test_prompt_too_wide_names_the_key():
    with pytest.raises(ValueError, match="max_prompt_length"):
        rollout(calc_then_answer, P=10)


def test_settings_validation():
    with pytest.raises(ValueError, match="tool_response_truncate_side"):
        MultiTurnSettings(tool_response_truncate_side="top")
    with pytest.raises(ValueError, match="format"):
        MultiTurnSettings(format="pythonic")
    with pytest.raises(ValueError, match="max_parallel_calls"):
        MultiTurnSettings(max_parallel_calls=0)
    # the same rules refuse the run config before any work, one line each
    key = "actor_rollout_ref.rollout.multi_turn"
    problems = config_problems(
        f"{key}.tool_response_truncate_side=top", f"{key}.format=pythonic", f"{key}.max_parallel_calls=0"
    )
    assert [p.split(":")[0] for p in sorted(problems)] == [
        f"{key}.format",
        f"{key}.max_parallel_calls",
        f"{key}.tool_response_truncate_side",
    ]
    (p,) = config_problems(f"{key}.interaction_config_path=sim.yaml")
    assert p.startswith(f"{key}.interaction_config_path=sim.yaml is accepted for verl compatibility but not")


def test_multiturn_metrics():
    m = multiturn_metrics({"num_turns": [2, 4, 6], "tool_call_counts": [0, 1, 2]})
    assert m == {
        "num_turns/min": 2.0,
        "num_turns/max": 6.0,
        "num_turns/mean": 4.0,
        "tool_call_counts/min": 0.0,
        "tool_call_counts/max": 2.0,
        "tool_call_counts/mean": 1.0,
        "tools/call_rate": pytest.approx(2 / 3),
    }


def test_with_the_real_engine_shapes_and_masks():
    """HFRollout on a random tiny Qwen2: the loop runs and masks stay consistent."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo.rollout.hf import HFRollout

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(TOK),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=TOK.pad_token_id,
        eos_token_id=TOK.eos_token_id,
    )
    engine = HFRollout(Qwen2ForCausalLM(cfg), [TOK.eos_token_id], TOK.pad_token_id, seed=0)
    mt = MultiTurnRollout(engine, TOK, [CalculatorTool()])
    out, info = mt.generate(rows(2), SamplingParams(n=3, response_length=40), prompt_width=64)
    assert out.responses.shape == (6, 40) and out.attention_mask.shape == (6, 104)
    assert torch.all(out.response_mask <= out.attention_mask[:, 64:])
    assert len(info["num_turns"]) == 6


class _SleepyLLM:
    """vLLM's ``LLM`` as the in-process engine drives it with sleep mode on: a log of sleeps,
    wake-ups and generate calls; replies from ``calc_then_answer`` on the decoded prompt."""

    def __init__(self):
        self.events: list[str] = []

    def sleep(self, level):
        self.events.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.events.append(f"wake {','.join(tags)}")

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        self.events.append("generate")
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            reply = TOK(calc_then_answer(TOK.decode(p["prompt_token_ids"])), add_special_tokens=False)
            ids = (reply["input_ids"] + [TOK.eos_token_id])[: sp.max_tokens]
            comps = [
                SimpleNamespace(
                    index=i,
                    token_ids=ids,
                    logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in ids],
                    finish_reason="stop",
                )
                for i in range(sp.n)
            ]
            outs.append(SimpleNamespace(outputs=comps))
        return outs


def test_vllm_engine_stays_awake_across_turns():
    # with free_cache_engine on a GPU, sleeping between turns would discard the weights and the
    # KV cache of the context the next turn extends: the engine sleeps only when the handoff says
    # so (dapo.rollout.handoff), never after a generation
    pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")
    from dapo.rollout.vllm_rollout import VllmEngineBase, VllmRollout, VllmSettings

    eng = object.__new__(VllmRollout)
    settings = VllmSettings.for_model("float32", 512, device="cuda", free_cache_engine=True)
    VllmEngineBase.__init__(eng, [TOK.eos_token_id], TOK.pad_token_id, settings, seed=0)
    eng.llm, eng._asleep = _SleepyLLM(), {"weights", "kv_cache"}
    mt = MultiTurnRollout(eng, TOK, [CalculatorTool()], MultiTurnSettings())
    out, info = mt.generate(rows(2), SamplingParams(n=2, response_length=200), prompt_width=64)
    assert info["num_turns"] == [4] * 4  # call, tool, answer: two generate calls
    assert eng.llm.events == ["wake weights,kv_cache", "generate", "generate"]
    assert not eng._asleep
    eng.generate([[5, 6]], SamplingParams(n=1, response_length=4))
    assert eng.llm.events[3:] == ["generate"]
    assert eng.sleep() and eng.llm.events[4:] == ["sleep 2"] and eng.synced_version is None
    assert not eng.sleep()  # asleep already
