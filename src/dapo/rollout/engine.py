"""The fast sampling loop: one prefill per prompt, a preallocated KV cache, a shrinking batch.

Compared with ``model.generate`` on the same model and sampling settings (the output
distribution is the same; see tests/test_rollout_engine.py):

* the KV cache for prompt plus response, every layer's keys and values, is one tensor
  allocated once (no per-step concatenation);
* each prompt is prefilled once and its keys/values copied to its ``n`` sample rows;
* finished rows stop being computed: once enough rows of the live batch are done, the batch
  and its cache are compacted to the live rows (``compact_fraction``; one copy of the columns
  written so far);
* the decode step runs on the model's weights in a merged form (``DecoderFn.decode``): about
  half the ops of the module-by-module forward, which is what a small batch step costs;
* sampling scales the step's logits in place and takes the log-prob from one gather and one
  logsumexp (no extra vocabulary-sized copies); transformers' per-step mask building, cache
  objects and logits processors are skipped;
* ``compile=True`` wraps the decode step in ``torch.compile`` (dynamic shapes). Experimental:
  not exercised by the tests; on this 2-core CPU compiling the tiny model's step took about
  four minutes and the step was no faster than the eager one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo.model.decoder_fn import DecoderFn
from dapo.rollout.sampling_ops import sample_tokens


@dataclass
class EngineResult:
    responses: torch.Tensor  # [B*n, R] right-padded
    log_probs: torch.Tensor  # [B*n, R] 0 on padding
    lengths: torch.Tensor  # [B*n]
    finished: torch.Tensor  # [B*n] bool: stopped on an EOS token
    decode_steps: int
    computed_rows: int  # sum over decode steps of the rows actually run (after compaction)


class FastEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: torch.Tensor,
        pad_token_id: int,
        compact_fraction: float = 0.25,
        compile: bool = False,
    ):
        self.fn = DecoderFn(model)
        self.eos = eos_token_ids
        self.pad_token_id = pad_token_id
        self.compact_fraction = compact_fraction
        self._decode = torch.compile(self.fn.decode, dynamic=True) if compile else self.fn.decode

    @torch.no_grad()
    def run(
        self,
        prompts: torch.Tensor,
        prompt_mask: torch.Tensor,
        n: int,
        response_length: int,
        temperature: float,
        top_k: int,
        top_p: float,
        do_sample: bool,
        generator: torch.Generator | None,
    ) -> EngineResult:
        """``prompts`` [B, P] left-padded, one row per distinct prompt; returns B*n rows, prompt-major."""
        device = prompts.device
        b, p = prompts.shape
        rows_total, r = b * n, response_length
        eos = self.eos.to(device)
        fused, head = self.fn.fuse(), self.fn.head()
        cache = self.fn.new_cache(rows_total, p + r, device)
        rope = self.fn.rotary_table(p + r, device)
        logits = self.fn.prefill(fused, prompts, prompt_mask, cache, repeat=n)
        if n > 1:
            logits = logits.repeat_interleave(n, dim=0)
        key_bias = torch.zeros((rows_total, p + r), dtype=self.fn.dtype, device=device)
        key_bias[:, :p].masked_fill_(~prompt_mask.bool().repeat_interleave(n, dim=0), float("-inf"))
        positions = prompt_mask.long().sum(-1).repeat_interleave(n)
        responses = torch.full((rows_total, r), self.pad_token_id, dtype=torch.long, device=device)
        log_probs = torch.zeros((rows_total, r), dtype=torch.float32, device=device)
        lengths = torch.zeros(rows_total, dtype=torch.long, device=device)
        finished = torch.zeros(rows_total, dtype=torch.bool, device=device)
        rows = torch.arange(rows_total, device=device)  # original row of each live-batch row
        alive = torch.ones(rows_total, dtype=torch.bool, device=device)
        all_alive = True
        steps = computed = 0
        for t in range(r):
            tok, lp = sample_tokens(logits, temperature, top_k, top_p, do_sample, generator, inplace=True)
            if all_alive:
                idx, tok_a, lp_a = rows, tok, lp
            else:
                idx, tok_a, lp_a = rows[alive], tok[alive], lp[alive]
            responses[idx, t] = tok_a
            log_probs[idx, t] = lp_a
            lengths[idx] = t + 1
            hit = torch.isin(tok, eos)
            hit &= alive
            finished[rows[hit]] = True
            alive &= ~hit
            n_alive = int(alive.sum())
            if n_alive == 0 or t == r - 1:
                break
            all_alive = n_alive == alive.numel()
            dead = alive.numel() - n_alive
            if dead and dead >= self.compact_fraction * alive.numel():
                keep = alive.nonzero().squeeze(-1)
                cache = self.fn.compact_cache(cache, keep, p + t)
                rows, tok, positions, key_bias = rows[keep], tok[keep], positions[keep], key_bias[keep]
                alive = torch.ones(n_alive, dtype=torch.bool, device=device)
                all_alive = True
            logits = self._decode(
                fused, head, tok, positions + t, cache, p + t, key_bias[:, : p + t + 1], rope
            )
            steps += 1
            computed += int(tok.shape[0])
        return EngineResult(responses, log_probs, lengths, finished, steps, computed)
