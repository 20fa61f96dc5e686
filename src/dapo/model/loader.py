"""Loading Hugging Face causal LMs and tokenizers from a local directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from dapo.errors import ModelError


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    p = _check_dir(path)
    try:
        if _generic_fast_tokenizer(p):
            # AutoTokenizer would pick the tokenizer class of config.json's model type (e.g. Qwen2's,
            # which drops spaces from a character vocabulary); a generic tokenizer.json loads as is
            tok = PreTrainedTokenizerFast.from_pretrained(str(p))
        else:
            tok = AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(_load_failure(p, "tokenizer", e)) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if getattr(tok, "chat_template", None) is None:
        raise ModelError(
            f"tokenizer in {p} has no chat template; add one (tokenizer_config.json 'chat_template') "
            "or set actor_rollout_ref.model.custom_chat_template"
        )
    return tok


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
) -> PreTrainedModel:
    p = _check_dir(path)
    try:
        return AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(_load_failure(p, "model", e)) from None


def load_model_layout(
    path: str | Path, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
) -> PreTrainedModel:
    """The model of ``path`` with its parameters on the meta device (no memory, nothing read
    but the config files): names, shapes, dtypes, config and generation config, for a trainer
    whose weights live on worker ranks. Buffers (rotary tables) are real."""
    from transformers import AutoConfig, GenerationConfig

    from dapo.model.meta import parameters_on_meta

    p = _check_dir(path)
    try:
        config = AutoConfig.from_pretrained(str(p), trust_remote_code=trust_remote_code)
        with parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(_load_failure(p, "model", e)) from None
    if model.can_generate():
        # as from_pretrained reads it (the files it writes again must be the same): the directory's
        # generation_config.json, else one made from the generation keys of its config.json
        try:
            model.generation_config = GenerationConfig.from_pretrained(str(p), _from_auto=True)
        except OSError:
            model.generation_config = GenerationConfig.from_pretrained(
                str(p), config_file_name="config.json", _from_auto=True, _from_model_config=True
            )
    return model


def _load_failure(p: Path, what: str, e: Exception) -> str:
    """One line for a directory transformers could not load (no weights, a config.json that is
    not JSON, no tokenizer files): its own first line, the path, and what to do."""
    reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    key = (
        "actor_rollout_ref.model.path"
        if what == "model"
        else "actor_rollout_ref.model.tokenizer_path (or path)"
    )
    return (
        f"{key}: the {what} in {p} does not load ({reason}); point it at a directory written by "
        "save_pretrained (config.json, the weights and the tokenizer files)"
    )


def _generic_fast_tokenizer(p: Path) -> bool:
    cfg = p / "tokenizer_config.json"
    if not (p / "tokenizer.json").exists() or not cfg.exists():
        return False
    import json

    return json.loads(cfg.read_text()).get("tokenizer_class") in (
        "TokenizersBackend",
        "PreTrainedTokenizerFast",
    )


def _check_dir(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir() or not (p / "config.json").exists():
        raise ModelError(
            f"actor_rollout_ref.model.path={path}: not a Hugging Face model directory (needs config.json); "
            "point it at a directory written by save_pretrained, or leave it unset for the built-in tiny model"
        )
    return p


def build_policy(
    model_cfg: Any,
    *,
    path: str,
    tokenizer_path: str,
    device: str,
    model_dtype: str,
    weights: bool = True,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel, torch.device]:
    """The policy of ``actor_rollout_ref.model`` loaded from ``path`` (``dapo.tasks.run_files``:
    the configured directory or the built-in model), its tokenizer and its device:
    ``(tokenizer, model, device)``, the model in train mode. ``device`` is ``trainer.device``,
    ``model_dtype`` ``actor.fsdp_config.model_dtype``. ``weights=False``: the parameters stay on
    the meta device (:func:`load_model_layout`; the weights live on worker ranks)."""
    from dapo.model.precision import resolve_model_dtype

    m = model_cfg
    tokenizer = load_tokenizer(tokenizer_path, trust_remote_code=m.trust_remote_code)
    if m.custom_chat_template:
        tokenizer.chat_template = m.custom_chat_template
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelError(
            "trainer.device=cuda: this machine has no CUDA device (torch.cuda.is_available() is false); "
            "set trainer.device=cpu"
        )
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    load = load_model if weights else load_model_layout
    model = load(path, dtype=resolve_model_dtype(model_dtype, dev), trust_remote_code=m.trust_remote_code)
    for k, v in m.override_config.items():
        setattr(model.config, k, v)
    if m.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    if weights:  # a layout stays where it is: it computes nothing
        model.to(dev)
    return tokenizer, model, dev
