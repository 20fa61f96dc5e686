#!/usr/bin/env bash
# The GPU check: everything dapo claims about CUDA, in one run of at most 8 minutes on one GPU.
#
#   benchmarks/gpu_check.sh OUT_DIR          # on a CUDA machine
#   benchmarks/gpu_check.sh --dry OUT_DIR    # the same steps on CPU with tiny sizes (CI runs this)
#
# Needs no network: a checkout, the machine's torch and transformers, and the pure-Python wheels
# below in .whl/ (git-ignored; it travels with the checkout). Fetch them beforehand with
#
#   pip download --no-deps --only-binary=:all: -d .whl omegaconf==2.3.0 hydra-core==1.3.2 \
#       antlr4-python3-runtime==4.9.3 rich markdown-it-py mdurl pygments
#
# (antlr4-python3-runtime 4.9.3 has no wheel on PyPI: `pip wheel --no-deps -w .whl
# antlr4-python3-runtime==4.9.3` builds one). They are installed with --no-deps into
# .whl/site, which goes on PYTHONPATH; modules the machine already has are used as they are.
#
# Steps, each bounded by a timeout and recorded in OUT_DIR/gpu_check.json:
#   env      torch / transformers versions, the device
#   tests    the CUDA tests (tests/test_algo_cuda.py, the nccl FSDP test) via pytest
#   train    `dapo train` of a SmolLM2-135M-shaped model (random weights: no download) in bf16
#            with the built-in rollout engine: tokens/s, MFU, peak memory
#   fsdp     the same run on one FSDP rank (trainer.worker_backend=process)
#   sp       SP=1 vs SP=2: skipped with the reason when fewer than two devices
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry" ]; then DRY=1; shift; fi
OUT="${1:?usage: benchmarks/gpu_check.sh [--dry] OUT_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
SITE="$ROOT/.whl/site"
if compgen -G "$ROOT/.whl/*.whl" >/dev/null && [ ! -d "$SITE" ]; then
  "$PY" -m pip install -q --no-deps --no-index --target "$SITE" "$ROOT"/.whl/*.whl || exit 2
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
export DAPO_GPU_CHECK_DRY=$DRY DAPO_GPU_CHECK_OUT="$OUT"
cd "$ROOT" || exit 2
if [ "$DRY" = 1 ]; then DEVICE=cpu; else DEVICE=cuda; fi

step() {  # step NAME SECONDS CMD...: run, keep its log and exit status
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$OUT/steps.jsonl"
  echo "gpu_check: $name rc=$rc ($((SECONDS - t0)) s)"
}
: >"$OUT/steps.jsonl"

# ---------------------------------------------------------------- the model (SmolLM2-135M shape)
step model 120 "$PY" - "$OUT/model" <<'EOF'
import os, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from dapo.model.tokenizer import build_char_tokenizer

dry = os.environ["DAPO_GPU_CHECK_DRY"] == "1"
tok = build_char_tokenizer()
# SmolLM2-135M: 30 layers, hidden 576, 9 heads / 3 kv heads, MLP 1536, 49152 vocabulary, tied
shape = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=128) if dry else dict(
             num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
             intermediate_size=1536, vocab_size=49152)
cfg = LlamaConfig(**shape, max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
print("params", sum(p.numel() for p in LlamaForCausalLM(cfg).parameters()))
EOF

# ---------------------------------------------------------------- the CUDA tests
step tests 180 "$PY" -m pytest -q -p no:cacheprovider tests/test_algo_cuda.py \
  "tests/test_distributed_fsdp.py::test_nccl_two_gpus_equal_one_rank" -rs --junitxml="$OUT/tests.xml"

# ---------------------------------------------------------------- training runs
if [ "$DRY" = 1 ]; then
  # the fewest rows that still make two steps and a final validation (of two prompts, one sample each)
  SIZES=(data.train_batch_size=2 data.gen_batch_size=2 actor_rollout_ref.rollout.n=2
         actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
         data.max_response_length=16 trainer.total_training_steps=2 data.val_max_samples=2
         actor_rollout_ref.rollout.val_kwargs.n=1)
else
  SIZES=(data.train_batch_size=32 data.gen_batch_size=32 actor_rollout_ref.rollout.n=8
         actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64
         data.max_response_length=256 trainer.total_training_steps=4)
fi
COMMON=(actor_rollout_ref.model.path="$OUT/model" trainer.device=$DEVICE trainer.torch_threads=1
        trainer.logger=[console,jsonl] trainer.val_before_train=false trainer.test_freq=-1
        trainer.save_freq=-1 trainer.save_final_model=false algorithm.filter_groups.enable=false
        "${SIZES[@]}")
step train 240 "$PY" -m dapo.cli train "${COMMON[@]}" trainer.default_local_dir="$OUT/run_train" \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bf16
step fsdp 150 "$PY" -m dapo.cli train "${COMMON[@]}" trainer.default_local_dir="$OUT/run_fsdp" \
  trainer.worker_backend=process trainer.n_gpus_per_node=1

# ---------------------------------------------------------------- the figures
"$PY" - <<'EOF'
import json, os, xml.etree.ElementTree as ET
from pathlib import Path

import torch
import transformers

out = Path(os.environ["DAPO_GPU_CHECK_OUT"])
dry = os.environ["DAPO_GPU_CHECK_DRY"] == "1"
steps = {s["step"]: s for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
cuda = torch.cuda.is_available() and not dry
devices = torch.cuda.device_count() if cuda else 1


def run_figures(name: str) -> dict:
    f = out / f"run_{name}" / "metrics.jsonl"
    rows = [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []
    rows = [r for r in rows if "perf/throughput" in r]
    res = {"rc": steps[name]["rc"], "seconds": steps[name]["seconds"], "steps": len(rows)}
    if rows:
        last = rows[-1]  # the first step includes warm-up
        res.update(
            tokens_per_s=last.get("perf/throughput"),
            mfu=last.get("perf/mfu/actor"),
            peak_memory_gb=max(r.get("perf/max_memory_allocated_gb", 0.0) for r in rows),
            pg_loss=last.get("actor/pg_loss"),
        )
    return res


tests = {"rc": steps["tests"]["rc"], "passed": 0, "failed": 0, "skipped": 0, "skip_reasons": []}
xml = out / "tests.xml"
if xml.exists():
    for case in ET.parse(xml).getroot().iter("testcase"):
        skip = case.find("skipped")
        if skip is not None:
            tests["skipped"] += 1
            tests["skip_reasons"].append(skip.get("message", ""))
        elif case.find("failure") is not None or case.find("error") is not None:
            tests["failed"] += 1
        else:
            tests["passed"] += 1
figures = {
    "dry": dry,
    "env": {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "devices": devices,
    },
    "model": {"rc": steps["model"]["rc"]},
    "tests": tests,
    "train_bf16": run_figures("train"),
    "fsdp_1_rank": run_figures("fsdp"),
    "sp": {"skipped": True, "reason": f"SP=2 needs two devices; this machine has {devices}"}
    if devices < 2
    else {"skipped": True, "reason": "not part of this check yet"},
}
(out / "gpu_check.json").write_text(json.dumps(figures, indent=1))
print(json.dumps(figures, indent=1))
EOF
