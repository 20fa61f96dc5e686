"""Child process of test_auto_budget: one PPO update under an address-space limit (RLIMIT_AS).

argv: model_dir, budget (a number of tokens or ``auto``), limit in MiB above the current virtual
size. Prints one JSON line: the chosen budget and the loss, or the error."""

from __future__ import annotations

import json
import resource
import sys

import torch

from dapo.actor.auto_budget import _statm
from dapo.actor.dp_actor import Actor, actor_settings
from dapo.bench.common import padded_rl_batch
from dapo.model.loader import load_model

ROWS, P, R = 32, 32, 480


def main() -> None:
    model_dir, budget, limit_mb = sys.argv[1], sys.argv[2], float(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = load_model(model_dir)
    g = torch.Generator().manual_seed(0)
    plen = torch.randint(P // 2, P + 1, (ROWS,), generator=g)
    rlen = torch.randint(R // 2, R + 1, (ROWS,), generator=g)
    batch = padded_rl_batch(plen, rlen, P, R, model.config.vocab_size, g, token_low=7, group_size=4)
    auto = budget == "auto"
    s = actor_settings(
        ppo_mini_batch_size=ROWS,
        ppo_micro_batch_size_per_gpu=ROWS,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu="auto" if auto else int(budget),
        rollout=dict(log_prob_micro_batch_size_per_gpu=ROWS),
    )
    actor = Actor(model, torch.optim.AdamW(model.parameters(), lr=1e-4), s)
    logs: list[str] = []
    actor.log = logs.append
    actor.update_policy(batch.select(torch.arange(2).numpy()))  # lazy allocations before the limit
    if limit_mb > 0:
        vms, _ = _statm()
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (vms + int(limit_mb * 2**20), hard))
    if auto:
        actor.auto_ppo.value = None  # choose under the limit
    try:
        m = actor.update_policy(batch)
    except (RuntimeError, MemoryError) as e:
        print(json.dumps({"ok": False, "error": str(e)[:200]}))
        return
    lengths = batch.tensors["attention_mask"].sum(1)
    tokens, longest = int(lengths.sum()), int(lengths.max())
    print(
        json.dumps(
            {
                "ok": True,
                "loss": m["actor/pg_loss"],
                "budget": actor.ppo_budget,
                "tokens": tokens,
                "longest": longest,
                "logs": logs,
            }
        )
    )


if __name__ == "__main__":
    main()
