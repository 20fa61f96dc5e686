"""Multi-turn rollouts with tools (verl's tool agent loop; docs/tools.md).

For each trajectory: render the prompt with the tool schemas through the chat template,
then repeat

  generate an assistant turn (response_mask 1) -> parse tool calls (hermes) -> run at most
  ``max_parallel_calls`` of them -> append the tool messages and the next generation prompt
  (response_mask 0, never trained on)

until a turn has no call, ``max_assistant_turns`` / ``max_user_turns`` is reached, or the
response budget (``response_length``) would be exceeded. Malformed calls (bad JSON, unknown
tool, wrong arguments) are answered with a tool error message and counted; tool failures and
sandbox refusals never stop the step.

The result is a :class:`MultiTurnOutput`, a :class:`~dapo.rollout.hf.RolloutOutput` with an
``attention_mask`` [B, P+R] (1 on every real token, tool tokens included: later assistant
tokens attend to them), and a dict of per-sample lists: ``num_turns`` (user + assistant turns
+ 1, as verl counts), ``tool_call_counts``, ``tool_errors``, ``tool_rewards`` and
``messages`` (the turns as chat messages, for dumps).

Trajectories are prompt-major, ``n`` consecutive samples per prompt, like ``HFRollout``.
The first turn samples all ``n`` responses of a prompt from one prefill; later turns
continue every live trajectory from its own context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from dapo.config.schema import MultiTurnConfig
from dapo.config.validate import multi_turn_problems
from dapo.rollout.hf import RolloutOutput, SamplingParams
from dapo.tools.base import BaseTool, ToolResponse
from dapo.tools.parser import ToolCall, get_parser

# error kinds counted in metrics as tools/<kind>
ERROR_KINDS = (
    "malformed",
    "unknown_tool",
    "bad_arguments",
    "tool_error",
    "code_error",
    "sandbox_refused",
    "sandbox_timeout",
    "sandbox_cpu_limit",
    "sandbox_memory_limit",
    "sandbox_output_limit",
    "sandbox_killed",
)


@dataclass
class MultiTurnOutput(RolloutOutput):
    attention_mask: torch.Tensor = field(default=None)  # type: ignore[assignment]  # [B, P+R]

    def full_attention_mask(self, rows: list[dict[str, Any]]) -> torch.Tensor:
        # the prompts carry the tool schemas, so the rows' own prompt_ids do not give their lengths;
        # tool tokens are attended to (attention 1) but never trained on (response_mask 0)
        return self.attention_mask


@dataclass
class MultiTurnSettings(MultiTurnConfig):
    """What the loop reads: ``actor_rollout_ref.rollout.multi_turn`` (the schema's block, its keys
    and defaults) plus ``tool_workers``, which the config does not set. The config pipeline
    checks the block's rules (``dapo.config.validate.multi_turn_problems``); a loop built
    directly checks the same rules here."""

    tool_workers: int = 2  # threads running tool calls concurrently (ours)

    def __post_init__(self) -> None:
        problems = multi_turn_problems(self)
        if problems:
            raise ValueError(problems[0])
        get_parser(self.format)

    @staticmethod
    def from_config(cfg: Any) -> MultiTurnSettings:
        """From the schema's block (or a mapping of its keys)."""
        keys = dict(cfg) if isinstance(cfg, dict) else dataclasses.asdict(cfg)
        return MultiTurnSettings(**keys)


def truncate_tool_text(text: str, limit: int, side: str) -> str:
    """verl's rule: ``left`` keeps the head, ``right`` keeps the tail, ``middle`` keeps both halves."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :]


@dataclass
class _Trajectory:
    row: dict[str, Any]
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_reward: float = 0.0
    done: bool = False
    truncated: bool = False
    messages: list[dict[str, str]] = field(default_factory=list)
    instances: dict[str, str] = field(default_factory=dict)
    turn_start: int = 0


class MultiTurnRollout:
    """Wraps a single-turn engine (``generate(prompt_ids, params, prompt_width) -> RolloutOutput``)."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        tools: list[BaseTool],
        settings: MultiTurnSettings | Any = None,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = {t.name: t for t in tools}
        self.settings = (
            settings
            if isinstance(settings, MultiTurnSettings)
            else MultiTurnSettings.from_config(settings or {})
        )
        self.parse = get_parser(self.settings.format)
        self.schemas = [t.get_openai_tool_schema() for t in tools]
        self.pad_id = engine.pad_token_id if hasattr(engine, "pad_token_id") else tokenizer.pad_token_id
        self.eos_text = getattr(tokenizer, "eos_token", None) or ""
        self._base_text = self._template(_DELTA_BASE, add_generation_prompt=False, tokenize=False)
        self.last_metrics: dict[str, float] = {}

    def step_warnings(self) -> list[str]:
        """Lines for the trainer to repeat every step (a tool running with weakened safety)."""
        return [w for w in (t.step_warning() for t in self.tools.values()) if w]

    @staticmethod
    def from_config(engine: Any, tokenizer: Any, multi_turn_cfg: Any) -> MultiTurnRollout:
        """Build from ``actor_rollout_ref.rollout.multi_turn`` (loads ``tool_config_path``)."""
        from dapo.tools.config import load_tool_config

        path = multi_turn_cfg.tool_config_path
        tools = load_tool_config(path) if path else []
        return MultiTurnRollout(engine, tokenizer, tools, MultiTurnSettings.from_config(multi_turn_cfg))

    # ------------------------------------------------------------------ templating
    def _template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        out = self.tokenizer.apply_chat_template(messages, **kwargs)
        if hasattr(out, "keys"):
            out = out["input_ids"]
        return out

    def prompt_ids(self, row: dict[str, Any]) -> list[int]:
        """The prompt with the tool schemas rendered by the chat template (verl's PENDING state)."""
        raw = row.get("raw_prompt")
        if not raw:
            return list(row["prompt_ids"])
        kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": True}
        if self.schemas:
            kwargs["tools"] = self.schemas
        return list(self._template(list(raw), **kwargs))

    def tool_message_ids(self, texts: list[str]) -> list[int]:
        """Tokens of tool messages plus the next generation prompt, as the template renders them."""
        msgs = [{"role": "tool", "content": t} for t in texts]
        full = self._template(_DELTA_BASE + msgs, add_generation_prompt=True, tokenize=False)
        if not full.startswith(self._base_text):
            raise ValueError(
                "the chat template does not render tool messages as a suffix of the conversation"
            )
        delta = full[len(self._base_text) :]
        return list(self.tokenizer(delta, add_special_tokens=False)["input_ids"])

    def _decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if self.eos_text and text.endswith(self.eos_text):
            text = text[: -len(self.eos_text)]
        return text

    # ------------------------------------------------------------------ the loop
    @torch.no_grad()
    def generate(
        self, rows: list[dict[str, Any]], params: SamplingParams, prompt_width: int
    ) -> tuple[MultiTurnOutput, dict[str, list]]:
        prompts = [self.prompt_ids(r) for r in rows]
        too_long = [len(p) for p in prompts if len(p) > prompt_width]
        if too_long:
            raise ValueError(
                f"a prompt with its tool schemas is {max(too_long)} tokens, over the prompt width {prompt_width}; "
                "raise data.max_prompt_length (or actor_rollout_ref.rollout.prompt_length)"
            )
        awake = getattr(self.engine, "awake", contextlib.nullcontext)
        with awake():
            return self._loop(rows, params, prompt_width, prompts)

    def _loop(
        self, rows: list[dict[str, Any]], params: SamplingParams, prompt_width: int, prompts: list[list[int]]
    ) -> tuple[MultiTurnOutput, dict[str, list]]:
        s = self.settings
        R, n = int(params.response_length), int(params.n)
        trajs = [_Trajectory(row=r, prompt=p) for r, p in zip(rows, prompts) for _ in range(n)]
        counts = {
            k: 0 for k in (*ERROR_KINDS, "calls", "dropped_calls", "response_truncated", "budget_stops")
        }
        first = self.engine.generate(prompts, params, prompt_width=None)
        pending = [(i, first, i) for i in range(len(trajs))]
        try:
            while pending:
                calls: list[tuple[int, ToolCall]] = []
                for ti, out, row_i in pending:
                    t = trajs[ti]
                    self._take_turn(t, out, row_i, R)
                    if t.done:
                        continue
                    parsed = self.parse(self._decode(t.tokens[t.turn_start :]))
                    if not parsed.calls:
                        t.done = True
                        continue
                    if s.max_user_turns is not None and t.user_turns >= s.max_user_turns:
                        t.done = True
                        continue
                    keep = parsed.calls[: s.max_parallel_calls]
                    counts["dropped_calls"] += len(parsed.calls) - len(keep)
                    calls.extend((ti, c) for c in keep)
                results = self._run_calls([(trajs[ti], c) for ti, c in calls], counts)
                by_traj: dict[int, list[str]] = {}
                for (ti, _), text in zip(calls, results):
                    by_traj.setdefault(ti, []).append(text)
                live: list[int] = []
                for ti, texts in by_traj.items():
                    t = trajs[ti]
                    delta = self.tool_message_ids(texts)
                    if len(t.tokens) + len(delta) >= R:
                        t.done = t.truncated = True
                        counts["budget_stops"] += 1
                        continue
                    t.tokens += delta
                    t.mask += [0] * len(delta)
                    t.logps += [0.0] * len(delta)
                    t.user_turns += 1
                    t.messages.extend({"role": "tool", "content": x} for x in texts)
                    live.append(ti)
                pending = []
                if live:
                    contexts = [trajs[i].prompt + trajs[i].tokens for i in live]
                    out = self._continue(contexts, params, [R - len(trajs[i].tokens) for i in live])
                    pending = [(ti, out, k) for k, ti in enumerate(live)]
        finally:
            self._release(trajs)
        return self._collect(trajs, prompt_width, R, counts)

    def _continue(
        self, contexts: list[list[int]], params: SamplingParams, budgets: list[int]
    ) -> RolloutOutput:
        """The next assistant turn of each live trajectory. An engine that takes a budget per
        request (vLLM) stops each one at its own room; the own engine decodes the batch to the
        largest room and :meth:`_take_turn` cuts the rest (the same tokens either way)."""
        if hasattr(self.engine, "generate_within"):
            return self.engine.generate_within(contexts, replace(params, n=1), budgets)
        return self.engine.generate(
            contexts, replace(params, n=1, response_length=max(budgets)), prompt_width=None
        )

    def _take_turn(self, t: _Trajectory, out: RolloutOutput, row_i: int, R: int) -> None:
        """Append generated row ``row_i`` of ``out`` to ``t`` (mask 1), cut to the remaining budget."""
        length = int(out.response_mask[row_i].sum())
        room = R - len(t.tokens)
        ids = out.responses[row_i, :length].tolist()
        lps = out.rollout_log_probs[row_i, :length].tolist()
        cut = length > room
        ids, lps = ids[:room], lps[:room]
        t.turn_start = len(t.tokens)
        t.tokens += ids
        t.mask += [1] * len(ids)
        t.logps += lps
        t.assistant_turns += 1
        t.messages.append({"role": "assistant", "content": self._decode(ids)})
        s = self.settings
        if cut or bool(out.truncated[row_i]):
            t.done = t.truncated = True
        elif len(t.tokens) >= R:
            t.done = True
        elif s.max_assistant_turns is not None and t.assistant_turns >= s.max_assistant_turns:
            t.done = True

    def _run_calls(self, calls: list[tuple[_Trajectory, ToolCall]], counts: dict[str, int]) -> list[str]:
        def one(item: tuple[_Trajectory, ToolCall]) -> tuple[str, str | None, float]:
            t, call = item
            if call.error is not None:
                return call.message, call.error, 0.0
            tool = self.tools.get(call.name or "")
            if tool is None:
                return (
                    f"Error: unknown tool {call.name!r}; available tools: {sorted(self.tools)}",
                    "unknown_tool",
                    0.0,
                )
            try:
                iid = t.instances.get(tool.name)
                if iid is None:
                    kwargs = _create_kwargs(t.row, tool.name)
                    iid = t.instances[tool.name] = tool.create(uuid.uuid4().hex, **kwargs)
                res: ToolResponse = tool.execute(iid, call.arguments)
            except Exception as exc:  # a tool that breaks its own contract still must not stop the step
                return f"Error: {type(exc).__name__}: {exc}", "tool_error", 0.0
            return res.text, res.error, float(res.reward)

        if not calls:
            return []
        workers = max(1, min(self.settings.tool_workers, len(calls)))
        if workers == 1:
            results = [one(c) for c in calls]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                results = list(pool.map(one, calls))
        texts = []
        lim, side = self.settings.max_tool_response_length, self.settings.tool_response_truncate_side
        for (t, _), (text, err, reward) in zip(calls, results):
            counts["calls"] += 1
            t.tool_calls += 1
            t.tool_reward += reward
            if err is not None:
                t.tool_errors += 1
                counts[err if err in counts else "tool_error"] += 1
            if len(text) > lim:
                counts["response_truncated"] += 1
            texts.append(truncate_tool_text(text, lim, side))
        return texts

    def _release(self, trajs: list[_Trajectory]) -> None:
        for t in trajs:
            for name, iid in t.instances.items():
                try:
                    self.tools[name].release(iid)
                except Exception:
                    pass
            t.instances.clear()

    def _collect(
        self, trajs: list[_Trajectory], P: int, R: int, counts: dict[str, int]
    ) -> tuple[MultiTurnOutput, dict[str, list]]:
        N = len(trajs)
        prompts = torch.full((N, P), self.pad_id, dtype=torch.long)
        responses = torch.full((N, R), self.pad_id, dtype=torch.long)
        mask = torch.zeros((N, R), dtype=torch.long)
        logps = torch.zeros((N, R), dtype=torch.float32)
        attn = torch.zeros((N, P + R), dtype=torch.long)
        for i, t in enumerate(trajs):
            lp, lr = len(t.prompt), len(t.tokens)
            if lp:
                prompts[i, P - lp :] = torch.as_tensor(t.prompt)
                attn[i, P - lp : P] = 1
            if lr:
                responses[i, :lr] = torch.as_tensor(t.tokens)
                mask[i, :lr] = torch.as_tensor(t.mask)
                logps[i, :lr] = torch.as_tensor(t.logps)
                attn[i, P : P + lr] = 1
        out = MultiTurnOutput(
            prompts=prompts,
            responses=responses,
            response_mask=mask,
            rollout_log_probs=logps * mask,
            truncated=torch.tensor([t.truncated for t in trajs], dtype=torch.bool),
            attention_mask=attn,
        )
        info: dict[str, list] = {
            "num_turns": [t.assistant_turns + t.user_turns + 1 for t in trajs],
            "tool_call_counts": [t.tool_calls for t in trajs],
            "tool_errors": [t.tool_errors for t in trajs],
            "tool_rewards": [t.tool_reward for t in trajs],
            "messages": [list(t.messages) for t in trajs],
        }
        metrics = {f"tools/{k}": float(v) for k, v in counts.items()}
        metrics.update(multiturn_metrics(info))
        self.last_metrics = metrics
        return out, info


def _create_kwargs(row: dict[str, Any], tool_name: str) -> dict[str, Any]:
    """``extra_info.tools_kwargs.<tool>.create_kwargs`` of a sample (verl's per-sample tool state)."""
    extra = row.get("extra_info") or {}
    tk = extra.get("tools_kwargs") or {}
    entry = tk.get(tool_name) or {}
    kwargs = entry.get("create_kwargs") or {}
    return {k: v for k, v in dict(kwargs).items() if v is not None}


# a neutral conversation whose rendering is a prefix of the same conversation plus tool messages
_DELTA_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


def multiturn_metrics(info: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """``num_turns/{min,max,mean}``, ``tool_call_counts/{min,max,mean}`` and ``tools/call_rate``
    (share of trajectories with at least one tool call) from per-sample lists."""
    out: dict[str, float] = {}
    for key in ("num_turns", "tool_call_counts"):
        vals = info.get(key)
        if vals is None or len(vals) == 0:
            continue
        arr = np.asarray(list(vals), dtype=np.float64)
        out[f"{prefix}{key}/min"] = float(arr.min())
        out[f"{prefix}{key}/max"] = float(arr.max())
        out[f"{prefix}{key}/mean"] = float(arr.mean())
    calls = info.get("tool_call_counts")
    if calls is not None and len(calls):
        out[f"{prefix}tools/call_rate"] = float(np.mean([float(c) > 0 for c in calls]))
    return out
