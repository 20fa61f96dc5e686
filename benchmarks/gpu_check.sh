#!/usr/bin/env bash
# The GPU check: everything dapo claims about CUDA, in one run that fits one 600 s device call
# (the steps' budgets add up to at most 540 s; `--plan` prints them).
#
#   benchmarks/gpu_check.sh OUT_DIR          # on a CUDA machine
#   benchmarks/gpu_check.sh --dry OUT_DIR    # the same steps on CPU with tiny sizes (CI runs this)
#   benchmarks/gpu_check.sh --plan           # the steps and their time budgets, and nothing else
#   DAPO_GPU_CHECK_SHAPE=qwen2.5-1.5b benchmarks/gpu_check.sh OUT_DIR
#                                            # the same with a Qwen2.5-1.5B-shaped model (bf16 file)
#
# Needs no network: a checkout, the machine's torch and transformers (and vLLM for the vllm step,
# which is skipped with its reason without it), and the wheels of benchmarks/gpu_check_wheels.txt
# in .whl/ (git-ignored; it travels with the checkout). Fetch them beforehand for the device
# machine's Python (pyarrow is not pure Python; its wheel is ~40 MB):
#
#   pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
#       --python-version 3.12 -d .whl -r benchmarks/gpu_check_wheels.txt
#
# (antlr4-python3-runtime 4.9.3 has no wheel on PyPI: `pip wheel --no-deps -w .whl
# antlr4-python3-runtime==4.9.3` builds one). They are installed with --no-deps into
# .whl/site, which goes on PYTHONPATH; modules the machine already has are used as they are.
#
# Each step is bounded by its budget and, as soon as it ends, its figures are merged into
# OUT_DIR/gpu_check.json (benchmarks/gpu_check_figures.py): a check cut short keeps what ran.
#   wheels   install .whl/ into .whl/site
#   model    a SmolLM2-135M-shaped model (random weights: no download)
#   tests    the CUDA tests (tests/test_algo_cuda.py, the nccl FSDP test) via pytest
#   train    `dapo train` in bf16 with the built-in rollout engine: tokens/s, MFU, peak memory
#   fsdp     the same run on one FSDP rank (trainer.worker_backend=process)
#   vllm     the same run with the colocated vLLM engine and its GPU defaults (sleep level 2,
#            gpu_memory_utilization 0.5, bf16, CUDA graphs): generation and weight-sync times
#   sp       SP=1 vs SP=2: recorded as skipped with the reason when fewer than two devices
set -uo pipefail

STEPS=(wheels model tests train fsdp vllm)
declare -A BUDGET=([wheels]=20 [model]=40 [tests]=90 [train]=110 [fsdp]=80 [vllm]=120)
declare -A WHAT=(
  [wheels]="install .whl/ into .whl/site"
  [model]="a SmolLM2-135M-shaped model (or DAPO_GPU_CHECK_SHAPE's), random weights"
  [tests]="the CUDA tests via pytest"
  [train]="dapo train, bf16, the built-in rollout engine"
  [fsdp]="the same on one FSDP rank"
  [vllm]="the same with the colocated vLLM engine (GPU defaults)"
)
FIGURES_S=10  # each step's figures are written within this many seconds after it (and the last print)

plan() {
  local total=0 s
  echo "gpu_check plan ($1):"
  for s in "${STEPS[@]}"; do
    printf '  %-7s %4d s + %d s figures  %s\n' "$s" "${BUDGET[$s]}" "$FIGURES_S" "${WHAT[$s]}"
    total=$((total + BUDGET[$s] + FIGURES_S))
  done
  printf '  %-7s %4d s             %s\n' print "$FIGURES_S" "gpu_check.json printed"
  echo "gpu_check budget: $((total + FIGURES_S)) s in all"
}

DRY=0
case "${1:-}" in
  --plan) plan "cuda"; exit 0 ;;
  --dry) DRY=1; shift ;;
esac
OUT="${1:?usage: benchmarks/gpu_check.sh [--dry|--plan] OUT_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
SITE="$ROOT/.whl/site"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}:$SITE"
export DAPO_GPU_CHECK_DRY=$DRY DAPO_GPU_CHECK_OUT="$OUT" DAPO_GPU_CHECK_SHAPE="${DAPO_GPU_CHECK_SHAPE:-smollm2-135m}"
cd "$ROOT" || exit 2
# the budgets are the GPU's; a dry run on a shared CPU gets three times as long a step before its timeout
if [ "$DRY" = 1 ]; then
  DEVICE=cpu SLACK=3
  plan "dry run on cpu, tiny sizes"
  echo "gpu_check: dry run: each step's timeout is ${SLACK}x its budget on this CPU"
else
  DEVICE=cuda SLACK=1
  plan "cuda"
fi

step() {  # step NAME CMD...: run within its budget, keep its log and exit status, write its figures
  local name=$1; shift
  local t0=$SECONDS
  timeout "$((BUDGET[$name] * SLACK))" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$OUT/steps.jsonl"
  echo "gpu_check: $name rc=$rc ($((SECONDS - t0)) s)"
  timeout "$((FIGURES_S * SLACK))" "$PY" benchmarks/gpu_check_figures.py "$OUT" "$name" >/dev/null 2>>"$OUT/figures.log"
}
: >"$OUT/steps.jsonl"
rm -f "$OUT/gpu_check.json"

# ---------------------------------------------------------------- the wheels
if compgen -G "$ROOT/.whl/*.whl" >/dev/null && [ ! -d "$SITE" ]; then
  step wheels "$PY" -m pip install -q --no-deps --no-index --target "$SITE" "$ROOT"/.whl/*.whl
else  # installed already, or none: the machine's modules as they are
  step wheels true
fi

# ---------------------------------------------------------------- the model (SmolLM2-135M shape)
step model "$PY" - "$OUT/model" <<'EOF'
import os, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from dapo.model.tokenizer import build_char_tokenizer

dry = os.environ["DAPO_GPU_CHECK_DRY"] == "1"
name = os.environ["DAPO_GPU_CHECK_SHAPE"]
tok = build_char_tokenizer()
SHAPES = {
    # 30 layers, hidden 576, 9 heads / 3 kv heads, MLP 1536, 49152 vocabulary, tied
    "smollm2-135m": dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True),
    # Qwen2.5-1.5B's sizes in a Llama (no attention biases): 1.5 B parameters
    "qwen2.5-1.5b": dict(num_hidden_layers=28, hidden_size=1536, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
}
if name not in SHAPES:
    sys.exit(f"DAPO_GPU_CHECK_SHAPE={name}: expected one of {', '.join(SHAPES)}")
# dry: head size 32, which vLLM's CPU attention accepts
shape = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=128, vocab_size=128, tie_word_embeddings=True) if dry else SHAPES[name]
cfg = LlamaConfig(**shape, max_position_embeddings=2048, rope_theta=100000.0,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() and not dry else "cpu"):  # a GPU draws 1.5 B faster
    model = LlamaForCausalLM(cfg)
if sum(p.numel() for p in model.parameters()) > 5e8:
    model = model.to(torch.bfloat16)  # half the file; the runs load it in their own dtype
model.save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
print("shape", name, "params", sum(p.numel() for p in model.parameters()))
EOF

# ---------------------------------------------------------------- the CUDA tests
step tests "$PY" -m pytest -q -p no:cacheprovider tests/test_algo_cuda.py tests/test_gpu_path_offload_cuda.py \
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
         data.max_response_length=128 trainer.total_training_steps=3)
fi
COMMON=(actor_rollout_ref.model.path="$OUT/model" trainer.device=$DEVICE trainer.torch_threads=1
        trainer.logger=[console,jsonl] trainer.val_before_train=false trainer.test_freq=-1
        trainer.save_freq=-1 trainer.save_final_model=false algorithm.filter_groups.enable=false
        "${SIZES[@]}")
step train "$PY" -m dapo.cli train "${COMMON[@]}" trainer.default_local_dir="$OUT/run_train" \
  actor_rollout_ref.actor.fsdp_config.model_dtype=bf16
step fsdp "$PY" -m dapo.cli train "${COMMON[@]}" trainer.default_local_dir="$OUT/run_fsdp" \
  trainer.worker_backend=process trainer.n_gpus_per_node=1

# ---------------------------------------------------------------- the colocated vLLM engine
if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"; then
  step vllm "$PY" -m dapo.cli train "${COMMON[@]}" trainer.default_local_dir="$OUT/run_vllm" \
    actor_rollout_ref.rollout.name=vllm
else
  step vllm sh -c 'echo "vllm is not importable on this machine"; exit 3'
fi

# ---------------------------------------------------------------- the end
timeout "$((FIGURES_S * SLACK))" "$PY" benchmarks/gpu_check_figures.py "$OUT" --print
