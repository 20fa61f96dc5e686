"""What ``dapo validate`` checks on this machine without running anything: the data files and the
model directory a configuration names exist and are what they claim to be, and the device it
asks for is here. One problem per line, naming the key and the path and how to fix it.

Only ``dapo validate`` runs these checks: a configuration is often written on one machine and
trained on another, and the trainer reports a missing file or device when it meets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DATA_KEYS = ("data.train_files", "data.val_files")
MODEL_KEY = "actor_rollout_ref.model.path"
TOKENIZER_KEY = "actor_rollout_ref.model.tokenizer_path"


def machine_problems(cfg: Any) -> list[str]:
    """Every problem of ``cfg`` (as loaded) with this machine's files and devices."""
    return [*data_file_problems(cfg), *model_problems(cfg), *device_problems(cfg)]


def _paths(files: Any) -> list[str]:
    """A data key's value (null, one path or a list) as a list of paths."""
    return [] if files is None else [files] if isinstance(files, str) else [str(f) for f in files]


def data_file_problems(cfg: Any) -> list[str]:
    """``data.train_files`` and ``data.val_files``: each path exists and is parquet with the
    ``data.prompt_key`` column (only the footer is read). Null means the built-in task."""
    prompt_key = str(cfg.data.prompt_key)
    out = []
    for key in DATA_KEYS:
        files = cfg.data[key.split(".", 1)[1]]
        paths = _paths(files)
        if files is not None and not paths:
            out.append(
                f"{key} is an empty list: give one or more verl parquet files (or null for the built-in task)"
            )
        for path in paths:
            problem = _parquet_problem(Path(path).expanduser(), prompt_key)
            if problem:
                out.append(f"{key}: {path} {problem}")
    return out


def _parquet_problem(path: Path, prompt_key: str) -> str | None:
    if not path.exists():
        return (
            "does not exist; point the key at a verl parquet file (`dapo preprocess` converts "
            "jsonl, json and csv files)"
        )
    if path.is_dir():
        return "is a directory; name the parquet file(s) in it (a list: [a.parquet,b.parquet])"
    try:
        import pyarrow.parquet as pq

        columns = pq.ParquetFile(path).schema_arrow.names
    except Exception as e:  # pyarrow raises several unrelated types for a file that is not parquet
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"is not a parquet file ({reason}); convert it with `dapo preprocess`"
    if prompt_key not in columns:
        return (
            f"has no column {prompt_key!r} (data.prompt_key; its columns: {', '.join(columns)}); "
            "set data.prompt_key to the prompt column"
        )
    return None


def model_problems(cfg: Any) -> list[str]:
    """``actor_rollout_ref.model.path`` is a Hugging Face model directory (null: the built-in
    model); ``tokenizer_path``, when set, is a directory."""
    model = cfg.actor_rollout_ref.model
    out = []
    if model.path is not None:
        path = Path(str(model.path)).expanduser()
        if not path.exists():
            out.append(f"{MODEL_KEY}: {model.path} does not exist; {_model_hint(str(model.path))}")
        elif not (path / "config.json").is_file():
            out.append(
                f"{MODEL_KEY}: {model.path} is not a Hugging Face model directory (it has no config.json); "
                "point it at a directory written by save_pretrained, or null for the built-in tiny model"
            )
        else:
            problem = _model_dir_problem(path)
            if problem:
                out.append(f"{MODEL_KEY}: {model.path} {problem}")
    if model.tokenizer_path is not None and not Path(str(model.tokenizer_path)).expanduser().is_dir():
        out.append(
            f"{TOKENIZER_KEY}: {model.tokenizer_path} is not a directory; point it at the tokenizer's "
            "directory, or null to use the model's"
        )
    return out


WEIGHT_FILES = ("*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin")


def _model_dir_problem(path: Path) -> str | None:
    """What makes a directory with a config.json unloadable, read without loading: a config.json
    that is not a JSON object, or no weights file."""
    import json

    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"has a config.json that does not parse ({e}); write it again with save_pretrained"
    if not isinstance(config, dict):
        return "has a config.json that is not a JSON object; write it again with save_pretrained"
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        return (
            "has no weights (no *.safetensors or pytorch_model*.bin); save the model into it with "
            "save_pretrained, or point the key at the directory that has them"
        )
    return None


def _model_hint(path: str) -> str:
    parts = path.split("/")
    if len(parts) == 2 and all(parts) and not path.startswith((".", "~")):
        return (
            f"dapo loads local model directories only: download it first (`huggingface-cli download {path} "
            "--local-dir DIR`) and point the key at DIR"
        )
    return "point it at a Hugging Face model directory, or null for the built-in tiny model"


def cuda_device_count() -> int:
    """CUDA devices torch can use on this machine (0 when there is no CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_problems(cfg: Any) -> list[str]:
    """``trainer.device=cuda`` needs a CUDA device here, and on one node n_gpus_per_node of them.
    torch is imported only to answer that, never for ``trainer.device=cpu``."""
    tr = cfg.trainer
    if tr.device != "cuda":
        return []
    count = cuda_device_count()
    if count == 0:
        return [
            "trainer.device=cuda: this machine has no CUDA device (torch.cuda.is_available() is false); "
            "set trainer.device=cpu, or validate on the machine that trains"
        ]
    if int(tr.nnodes) == 1 and int(tr.n_gpus_per_node) > count:
        return [
            f"trainer.n_gpus_per_node={tr.n_gpus_per_node}: this machine has {count} CUDA device(s); "
            f"set trainer.n_gpus_per_node={count} or fewer"
        ]
    devices = cfg.actor_rollout_ref.rollout.server_devices
    if devices and max(int(d) for d in devices) >= count:
        return [
            f"actor_rollout_ref.rollout.server_devices={list(devices)}: this machine shows {count} CUDA "
            f"device(s) to the trainer, numbered 0 to {count - 1} (within CUDA_VISIBLE_DEVICES when it is "
            "set); pick the server's ids among them"
        ]
    return []
