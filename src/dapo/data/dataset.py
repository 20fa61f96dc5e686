"""The RL prompt dataset (verl's RLHFDataset semantics) and the stateful prompt sampler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dapo.data.check import refuse_bad_rows, rules_from_config
from dapo.data.parquet import DataError, read_rows


@dataclass
class PromptRow:
    """One prompt as the sampler hands it out. ``index`` is its stable position in the dataset."""

    index: int
    prompt_ids: list[int]
    raw_prompt: list[dict[str, str]]
    data_source: str
    reward_model: dict[str, Any]
    extra_info: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "prompt_ids": self.prompt_ids,
            "raw_prompt": self.raw_prompt,
            "data_source": self.data_source,
            "reward_model": self.reward_model,
            "extra_info": self.extra_info,
        }


def _files(files: Any) -> list[str]:
    if files is None:
        return []
    if isinstance(files, str):
        return [files]
    return [str(f) for f in files]


def load_prompts(
    files: Any,
    tokenizer: Any,
    max_prompt_length: int,
    *,
    prompt_key: str = "prompt",
    reward_fn_key: str = "data_source",
    filter_overlong_prompts: bool = False,
    truncation: str = "error",
    max_samples: int = -1,
    chat_template_kwargs: dict[str, Any] | None = None,
    files_key: str = "data.train_files",
) -> tuple[list[PromptRow], dict[str, int]]:
    """Read, template and length-check every prompt. Returns the rows and load statistics."""
    paths = _files(files)
    if not paths:
        raise DataError(f"{files_key} is empty: give one or more verl parquet files")
    rows: list[PromptRow] = []
    stats = {"rows": 0, "filtered_overlong": 0, "truncated": 0}
    for path in paths:
        for i, raw in enumerate(read_rows(path, prompt_key=prompt_key)):
            stats["rows"] += 1
            ids = tokenizer.apply_chat_template(
                raw["prompt"], add_generation_prompt=True, tokenize=True, **(chat_template_kwargs or {})
            )
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = list(ids)
            if len(ids) > max_prompt_length:
                if filter_overlong_prompts:
                    stats["filtered_overlong"] += 1
                    continue
                if truncation == "error":
                    raise DataError(
                        f"{path} row {i}: the prompt is {len(ids)} tokens after the chat template, over "
                        f"data.max_prompt_length={max_prompt_length}; set data.filter_overlong_prompts=true to drop "
                        "such rows, data.truncation=left|right|middle to cut them, or raise data.max_prompt_length"
                    )
                ids = truncate(ids, max_prompt_length, truncation)
                stats["truncated"] += 1
            ds = raw.get(reward_fn_key)
            if ds is None:
                raise DataError(f"{path} row {i}: column '{reward_fn_key}' (data.reward_fn_key) is empty")
            rows.append(
                PromptRow(
                    index=len(rows),
                    prompt_ids=ids,
                    raw_prompt=raw["prompt"],
                    data_source=str(ds),
                    reward_model=dict(raw["reward_model"]),
                    extra_info=dict(raw.get("extra_info") or {}),
                )
            )
            if 0 < max_samples <= len(rows):
                return rows, stats
    if not rows:
        raise DataError(f"{files_key}: no usable rows in {paths} (all filtered as overlong?)")
    return rows, stats


def truncate(ids: list[int], width: int, side: str) -> list[int]:
    if side == "left":
        return ids[-width:]
    if side == "right":
        return ids[:width]
    head = width // 2
    return ids[:head] + ids[len(ids) - (width - head) :]


class PromptSampler:
    """Hands out prompts in a seeded shuffled order, rolling over epochs; its position is state.

    ``take(k)`` never runs dry: at the end of an epoch it reshuffles and continues, so a
    partially filled dynamic-sampling pool is never dropped at an epoch boundary.
    """

    def __init__(self, rows: list[PromptRow], seed: int = 0, shuffle: bool = True):
        if not rows:
            raise DataError("the prompt dataset is empty")
        self.rows = rows
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self.served = 0
        self._order = self._make_order(0)

    def __len__(self) -> int:
        return len(self.rows)

    def _make_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def take(self, k: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(k):
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._make_order(self.epoch)
            out.append(self.rows[int(self._order[self.position])].as_dict())
            self.position += 1
            self.served += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "served": self.served, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.served = int(state["served"])
        self._order = self._make_order(self.epoch)


def refuse_bad_data(cfg: Any, train_files: Any, val_files: Any) -> None:
    """Raise a DataError for the first row of the run's data that ``dapo data check`` flags as an
    error under the run's reward settings (``dapo.data.check.rules_from_config``); it needs no
    tokenizer, so a run refuses its data before it loads the model."""
    rules = rules_from_config(cfg)
    refuse_bad_rows(_files(train_files), rules, "data.train_files")
    if val_files is not None:
        refuse_bad_rows(_files(val_files), rules, "data.val_files")


def build_prompt_data(
    d: Any,
    train_files: Any,
    val_files: Any,
    tokenizer: Any,
    prompt_width: int,
    *,
    val_only: bool = False,
    log: Callable[[str], None] = print,
) -> tuple[list[PromptRow], list[PromptRow], PromptSampler]:
    """``data.*``'s (``d``) train and validation prompts and the train sampler, read from
    ``train_files`` and ``val_files`` (``dapo.tasks.run_files``: the configured files or the
    built-in task's; no validation when ``val_files`` is None). ``val_only``
    (``trainer.val_only``, `dapo eval`) logs the validation set only."""
    common = dict(
        prompt_key=d.prompt_key,
        reward_fn_key=d.reward_fn_key,
        filter_overlong_prompts=d.filter_overlong_prompts,
        truncation=d.truncation,
        chat_template_kwargs=dict(d.apply_chat_template_kwargs),
    )
    train_rows, stats = load_prompts(
        train_files,
        tokenizer,
        prompt_width,
        max_samples=d.train_max_samples,
        files_key="data.train_files",
        **common,
    )
    val_rows: list[PromptRow] = []
    if val_files is not None:
        val_rows, _ = load_prompts(
            val_files,
            tokenizer,
            prompt_width,
            max_samples=d.val_max_samples,
            files_key="data.val_files",
            **common,
        )
    sampler = PromptSampler(train_rows, seed=int(d.seed), shuffle=d.shuffle)
    if val_only:  # `dapo eval`: the train set is not used, so its size says nothing
        log(f"data: {len(val_rows)} validation prompts")
        return train_rows, val_rows, sampler
    log(
        f"data: {len(train_rows)} train prompts, {len(val_rows)} validation prompts"
        + (f" ({stats['filtered_overlong']} over-long filtered)" if stats["filtered_overlong"] else "")
    )
    if len(train_rows) < int(d.train_batch_size):
        log(
            f"warning: {len(train_rows)} train prompts is fewer than one batch "
            f"(data.train_batch_size={d.train_batch_size}): each step repeats prompts, and with dynamic "
            "sampling a batch may never fill (steps with no update). Add prompts, or lower "
            "data.train_batch_size and data.gen_batch_size"
        )
    return train_rows, val_rows, sampler
