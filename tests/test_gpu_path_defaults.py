"""The vLLM engine's per-device defaults through the real config pipeline (verl's on CUDA, the CPU
build's exceptions on CPU), the engine arguments they become, `dapo validate --explain` naming the
device, and per-request seeds only where asked. No engine starts: these are the values handed to it."""

from __future__ import annotations

import torch

from dapo.cli import main
from dapo.config.pipeline import build_config
from dapo.rollout.hf import SamplingParams
from dapo.rollout.vllm_rollout import VllmEngineBase, VllmSettings, sampling_fields

R = "actor_rollout_ref.rollout"
# the DAPO recipe's lengths: 2048 + 20480 tokens, far above max_num_batched_tokens' 8192
# a model of one's own (not read by these rules): vLLM on CPU refuses the built-in models' head size
LONG = [
    "data.max_prompt_length=2048",
    "data.max_response_length=20480",
    f"{R}.name=vllm",
    "actor_rollout_ref.model.path=/models/m",
]


def _rollout(device: str, *extra: str):
    return build_config([*LONG, f"trainer.device={device}", *extra]).cfg.actor_rollout_ref.rollout


def _kwargs(r, device: str) -> dict:
    return VllmSettings.from_config(r, r.dtype or "float32", 2048 + 20480, device).engine_kwargs()


def test_gpu_path_cuda_defaults_are_verls():
    r = _rollout("cuda")
    assert (r.gpu_memory_utilization, r.dtype, r.enforce_eager, r.per_request_seed) == (
        0.5,
        "bfloat16",
        False,
        False,
    )
    kw = _kwargs(r, "cuda")
    # chunked prefill stays on (vLLM's default: no enable_chunked_prefill key) and the step budget is
    # the key's, not raised to max_model_len
    assert "enable_chunked_prefill" not in kw and kw["max_num_batched_tokens"] == 8192
    assert kw["gpu_memory_utilization"] == 0.5 and kw["enable_sleep_mode"] is True
    assert kw["dtype"] == "bfloat16" and kw["enforce_eager"] is False
    # an fp16 actor samples in fp16; values the user sets are kept
    assert _rollout("cuda", "actor_rollout_ref.actor.fsdp_config.model_dtype=fp16").dtype == "float16"
    r = _rollout("cuda", f"{R}.dtype=float32", f"{R}.enforce_eager=true", f"{R}.gpu_memory_utilization=0.7")
    assert (r.dtype, r.enforce_eager, r.gpu_memory_utilization) == ("float32", True, 0.7)


def test_gpu_path_cpu_keeps_its_exceptions():
    r = _rollout("cpu")
    assert (r.gpu_memory_utilization, r.dtype, r.enforce_eager, r.per_request_seed) == (
        None,
        None,
        True,
        True,
    )
    kw = _kwargs(r, "cpu")
    # each prompt is prefilled whole, so one step holds the longest prompt + response
    assert kw["enable_chunked_prefill"] is False and kw["max_num_batched_tokens"] == 2048 + 20480
    assert (
        "gpu_memory_utilization" not in kw and "enable_sleep_mode" not in kw and kw["enforce_eager"] is True
    )
    # the schema's defaults resolved the same way for an engine built from a model alone
    s = VllmSettings.for_model("float32", 512)
    assert s.enforce_eager and s.per_request_seed and s.gpu_memory_utilization is None
    s = VllmSettings.for_model("bfloat16", 512, device="cuda")
    assert not s.enforce_eager and not s.per_request_seed and s.gpu_memory_utilization == 0.5


def test_gpu_path_explain_names_the_device(capsys):
    assert main(["validate", "--explain", R, *LONG, "trainer.device=cuda"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = {ln.split(" = ")[0]: i for i, ln in enumerate(lines) if not ln.startswith(" ")}
    for key, value in [("enforce_eager", "false"), ("dtype", "bfloat16"), ("gpu_memory_utilization", "0.5")]:
        i = at[f"{R}.{key}"]
        assert (
            lines[i] == f"{R}.{key} = {value} (set null, resolved for trainer.device=cuda)   [default null]"
        )
        assert "on cuda" in lines[i + 1] and "on cpu" in lines[i + 1]
    i = at[f"{R}.per_request_seed"]
    assert lines[i].startswith(f"{R}.per_request_seed = false (set null, resolved for trainer.device=cuda)")
    assert "on cuda" in lines[at[f"{R}.max_num_batched_tokens"] + 1]
    assert main(["validate", "--explain", f"{R}.enforce_eager", *LONG]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{R}.enforce_eager = true (set null, resolved for trainer.device=cpu)")


def test_gpu_path_request_seeds_only_when_asked():
    params = SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, response_length=4)
    cpu = VllmEngineBase([2], 0, VllmSettings.for_model("float32", 64), seed=5)
    cuda = VllmEngineBase([2], 0, VllmSettings.for_model("bfloat16", 64, device="cuda"), seed=5)
    want = torch.randint(0, 2**31 - 1, (3,), generator=torch.Generator().manual_seed(5)).tolist()
    assert cpu.request_seeds(3) == want
    assert cuda.request_seeds(3) == [None, None, None]
    # the generator moves on the same either way: a checkpoint's generator state means the same thing
    assert torch.equal(cpu.generator.get_state(), cuda.generator.get_state())
    assert sampling_fields(params, [2], want[0])["seed"] == want[0]
    assert "seed" not in sampling_fields(params, [2], None)
    on = VllmEngineBase(
        [2], 0, VllmSettings.for_model("bfloat16", 64, device="cuda", per_request_seed=True), 5
    )
    assert on.request_seeds(3) == want
