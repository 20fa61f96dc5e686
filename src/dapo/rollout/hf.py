"""Batched sampling with a KV cache for any Hugging Face causal LM (CPU or GPU).

Llama-family models (qwen2, llama, mistral) go through ``dapo.rollout.engine.FastEngine``
(one prefill per prompt, preallocated cache, finished rows dropped); any other model through a
generic loop over the model's own forward with its own cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dapo.batch import Batch
from dapo.model.decoder_fn import supports
from dapo.rollout.engine import FastEngine
from dapo.rollout.sampling_ops import sample_tokens


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    response_length: int = 64


@dataclass
class RolloutOutput:
    """Per trajectory (prompt-major, n consecutive samples per prompt)."""

    prompts: torch.Tensor  # [B, P] left-padded
    responses: torch.Tensor  # [B, R] right-padded with pad_id
    response_mask: torch.Tensor  # [B, R]
    rollout_log_probs: torch.Tensor  # [B, R], 0 on padding
    truncated: torch.Tensor  # [B] bool: hit response_length without EOS

    def full_attention_mask(self, rows: list[dict[str, Any]]) -> torch.Tensor:
        """[B, P+R]: each row's prompt tokens (``rows``' ``prompt_ids``, left-padded) and its response."""
        width, n = self.prompts.shape[1], self.prompts.shape[0] // max(1, len(rows))
        lengths = torch.tensor([len(r["prompt_ids"]) for r in rows for _ in range(n)])
        prompt_mask = (torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)).long()
        return torch.cat([prompt_mask, self.response_mask], dim=1)

    def to_batch(self, rows: list[dict[str, Any]], non_tensors: dict[str, list] | None = None) -> Batch:
        """The trainer's batch: these trajectories with their prompts' rows (each repeated for its
        ``n`` samples) and any further per-trajectory columns."""
        attention_mask = self.full_attention_mask(rows)
        rep = [r for r in rows for _ in range(self.prompts.shape[0] // max(1, len(rows)))]
        return Batch(
            tensors={
                "prompts": self.prompts,
                "responses": self.responses,
                "input_ids": torch.cat([self.prompts, self.responses], dim=1),
                "attention_mask": attention_mask,
                "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
                "response_mask": self.response_mask,
                "rollout_log_probs": self.rollout_log_probs,
            },
            non_tensors={
                "index": [r["index"] for r in rep],
                "data_source": [r["data_source"] for r in rep],
                "reward_model": [r["reward_model"] for r in rep],
                "extra_info": [r["extra_info"] for r in rep],
                "truncated": self.truncated.tolist(),
                **(non_tensors or {}),
            },
        )


def left_pad(prompts: list[list[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p) > width:
            raise ValueError(f"prompt of {len(p)} tokens is longer than the prompt width {width}")
        if p:
            ids[i, width - len(p) :] = torch.as_tensor(p)
            mask[i, width - len(p) :] = 1
    return ids, mask


class HFRollout:
    """Autoregressive sampling on a ``transformers`` model with its own KV cache."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        seed: int = 0,
        engine: str = "auto",
        compile: bool = False,
        compact_fraction: float = 0.25,
    ):
        """``engine``: "auto" (fast engine when the model is supported), "fast" (required) or "hf"
        (the generic loop). ``compile`` wraps the fast engine's decode step in torch.compile."""
        if engine not in ("auto", "fast", "hf"):
            raise ValueError(f"engine must be auto, fast or hf, got {engine!r}")
        if engine == "fast" and not supports(model):
            raise ValueError(
                f"the fast rollout engine does not support {type(model).__name__}; use engine='hf'"
            )
        self.model = model
        self.eos_token_ids = torch.as_tensor(sorted(set(eos_token_ids)), dtype=torch.long)
        self.pad_token_id = pad_token_id
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.device_generators: dict[str, torch.Generator] = {}
        self.engine = None
        if engine != "hf" and supports(model):
            self.engine = FastEngine(
                model, self.eos_token_ids, pad_token_id, compact_fraction=compact_fraction, compile=compile
            )
        self.last_stats: dict[str, float] = {}

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, prompt_width: int | None = None
    ) -> RolloutOutput:
        n = params.n
        width = prompt_width or max(len(p) for p in prompt_ids)
        prompts, prompt_mask = left_pad(prompt_ids, width, self.pad_token_id)
        if self.engine is not None:
            return self._generate_fast(prompts, prompt_mask, params)
        prompts = prompts.repeat_interleave(n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
        device = next(self.model.parameters()).device
        batch, R = prompts.shape[0], params.response_length
        responses = torch.full((batch, R), self.pad_token_id, dtype=torch.long)
        logps = torch.zeros((batch, R), dtype=torch.float32)
        done = torch.zeros(batch, dtype=torch.bool)
        lengths = torch.zeros(batch, dtype=torch.long)
        eos = self.eos_token_ids.to(device)

        # Trim the shared left padding so the forward pass does not run over columns that are all pad.
        first = int((prompt_mask.sum(0) > 0).nonzero()[0]) if prompt_mask.any() else 0
        ids = prompts[:, first:].to(device)
        attn = prompt_mask[:, first:].to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1, :]
            next_pos = pos[:, -1:] + 1
            for t in range(R):
                tok, lp = sample_tokens(
                    logits,
                    params.temperature,
                    params.top_k,
                    params.top_p,
                    params.do_sample,
                    self._gen(device),
                )
                tok = torch.where(done.to(device), torch.full_like(tok, self.pad_token_id), tok)
                responses[:, t] = tok.cpu()
                live = ~done
                logps[live, t] = lp.cpu()[live]
                lengths[live] += 1
                done = done | torch.isin(tok, eos).cpu()
                if bool(done.all()) or t == R - 1:
                    break
                attn = torch.cat([attn, (~done).long().unsqueeze(-1).to(device)], dim=-1)
                out = self.model(
                    input_ids=tok.unsqueeze(-1),
                    attention_mask=attn,
                    position_ids=next_pos,
                    past_key_values=cache,
                    use_cache=True,
                )
                cache = out.past_key_values
                logits = out.logits[:, -1, :]
                next_pos = next_pos + 1
        finally:
            self.model.train(was_training)
        ar = torch.arange(R).unsqueeze(0)
        response_mask = (ar < lengths.unsqueeze(-1)).long()
        return RolloutOutput(
            prompts=prompts,
            responses=responses,
            response_mask=response_mask,
            rollout_log_probs=logps * response_mask,
            truncated=~done,
        )

    def _generate_fast(
        self, prompts: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams
    ) -> RolloutOutput:
        device = next(self.model.parameters()).device
        # cut the left padding shared by every prompt: it would only be masked out
        live = prompt_mask.bool().any(0)
        first = int(live.nonzero()[0]) if live.any() else 0
        res = self.engine.run(
            prompts[:, first:].to(device),
            prompt_mask[:, first:].to(device),
            params.n,
            params.response_length,
            params.temperature,
            params.top_k,
            params.top_p,
            params.do_sample,
            self._gen(device),
        )
        self.last_stats = {"decode_steps": res.decode_steps, "computed_rows": res.computed_rows}
        ar = torch.arange(params.response_length)
        lengths = res.lengths.cpu()
        response_mask = (ar.unsqueeze(0) < lengths.unsqueeze(-1)).long()
        return RolloutOutput(
            prompts=prompts.repeat_interleave(params.n, dim=0),
            responses=res.responses.cpu(),
            response_mask=response_mask,
            rollout_log_probs=res.log_probs.cpu() * response_mask,
            truncated=~res.finished.cpu(),
        )

    def _gen(self, device: torch.device) -> torch.Generator | None:
        if device.type == "cpu":
            return self.generator
        key = str(device)
        if key not in self.device_generators:
            self.device_generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self.device_generators[key]
