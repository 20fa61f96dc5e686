"""verl keys dapo accepts but does not implement, and other trainers' names for dapo's keys.

The accepted-and-ignored verl keys are data: ``verl_ignored.yaml`` beside this module, in groups
that share a reason. A group without ``accept`` is named in one warning when the user sets one of
its keys; a group with ``accept`` refuses every other value, because ignoring it would change
what is trained. Keys of dapo's schema are named only when they differ from their default; keys
outside the schema are dropped when the configuration loads (``dapo.config.load``) and named
whenever the user sets them. Only keys the user set (command line or their own yaml file) are
named, never a preset's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache
from importlib import resources
from typing import Any

from omegaconf import OmegaConf

from dapo.config.schema import DapoConfig

IGNORED_FILE = "verl_ignored.yaml"


@dataclass(frozen=True)
class IgnoredGroup:
    """verl keys ignored for one reason; ``accept`` (when given) lists the values allowed."""

    why: str
    keys: tuple[str, ...]
    accept: tuple[Any, ...] | None = None

    @property
    def reject(self) -> bool:
        return self.accept is not None

    def matches(self, key: str) -> bool:
        parts = key.split(".")
        return any(_match(p.split("."), parts) for p in self.keys)


@dataclass(frozen=True)
class Unimplemented:
    """A key of dapo's schema that nothing reads (its group's reason and accepted values)."""

    why: str
    reject: bool = False
    # values other than the default that mean what dapo does anyway
    same_as_default: tuple[Any, ...] = ()


def _match(pattern: list[str], key: list[str]) -> bool:
    if not pattern:
        return not key
    if pattern[0] == "**":
        return any(_match(pattern[1:], key[i:]) for i in range(len(key) + 1))
    return bool(key) and fnmatchcase(key[0], pattern[0]) and _match(pattern[1:], key[1:])


@cache
def ignored_groups() -> tuple[IgnoredGroup, ...]:
    """The groups of ``verl_ignored.yaml``, in file order."""
    import yaml

    text = (resources.files("dapo.config") / IGNORED_FILE).read_text(encoding="utf-8")
    groups = []
    for entry in yaml.safe_load(text):
        accept = entry.get("accept")
        groups.append(
            IgnoredGroup(
                why=str(entry["why"]),
                keys=tuple(str(k) for k in entry["keys"]),
                accept=None if accept is None else tuple(accept),
            )
        )
    return tuple(groups)


@cache
def _schema_defaults() -> Any:
    """The schema's defaults (read only)."""
    return OmegaConf.structured(DapoConfig)


def _in_schema(defaults: Any, key: str) -> bool:
    return OmegaConf.select(defaults, key, default="\0missing") != "\0missing"


@cache
def _schema_entries() -> dict[str, tuple[int, IgnoredGroup]]:
    """Keys of dapo's schema that a group lists by name -> (group index, group)."""
    defaults = _schema_defaults()
    out: dict[str, tuple[int, IgnoredGroup]] = {}
    for i, g in enumerate(ignored_groups()):
        for key in g.keys:
            if "*" not in key and key not in out and _in_schema(defaults, key):
                out[key] = (i, g)
    return out


def ignored_key_names() -> list[str]:
    """The accepted verl keys named in full (no wildcard), for suggestions."""
    return [k for g in ignored_groups() for k in g.keys if "*" not in k]


@cache
def _group_index(key: str) -> int | None:
    return next((i for i, g in enumerate(ignored_groups()) if g.matches(key)), None)


def ignored_group(key: str) -> IgnoredGroup | None:
    """The group that accepts ``key`` (a key outside dapo's schema), or None: an unknown key."""
    i = _group_index(key)
    return None if i is None else ignored_groups()[i]


@cache
def unimplemented() -> dict[str, Unimplemented]:
    """The keys of dapo's schema that nothing reads (``--explain`` marks them)."""
    defaults = _schema_defaults()
    out = {}
    for key, (_, g) in _schema_entries().items():
        default = OmegaConf.select(defaults, key)
        same = tuple(v for v in (g.accept or ()) if v != default)
        out[key] = Unimplemented(g.why, reject=g.reject, same_as_default=same)
    return out


def __getattr__(name: str) -> Any:
    # UNIMPLEMENTED is built on first use, so importing the config package stays quick
    if name == "UNIMPLEMENTED":
        return unimplemented()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class UserKeys:
    """What the user wrote, as opposed to what a preset set: every key given on the command line or
    in the user's own yaml file. ``set`` holds the keys of dapo's schema (after verl's aliases);
    ``ignored`` the accepted verl keys outside it, with the values given, in order."""

    set: set[str] = field(default_factory=set)
    ignored: dict[str, Any] = field(default_factory=dict)

    def touched(self, key: str) -> bool:
        """True when the user set ``key``, a key under it or a block holding it."""
        return any(k == key or k.startswith(key + ".") or key.startswith(k + ".") for k in self.set)


def _fmt(value: Any) -> str:
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    if isinstance(value, bool | type(None) | Mapping | list | tuple):
        return json.dumps(value, default=str)
    return str(value)


def _accepted(value: Any, accept: tuple[Any, ...]) -> bool:
    """``value`` is one of ``accept``; true, false and null only match themselves (not 1, 0)."""

    def same(a: Any) -> bool:
        if isinstance(value, bool | type(None)) or isinstance(a, bool | type(None)):
            return value is a
        return value == a

    return any(same(a) for a in accept)


def unimplemented_problems(cfg: Any, user: UserKeys | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the accepted-and-ignored verl keys of ``cfg`` (as loaded) and of
    ``user`` (None: every key counts as the user's). Errors: a key of a refusing group at a value
    it does not accept, wherever it was set. Warnings: one per group, naming each key the user set
    that has no effect (a schema key only when it differs from its default)."""
    defaults = _schema_defaults()
    groups = ignored_groups()
    errors: list[str] = []
    named: dict[int, list[tuple[str, str]]] = {}
    for key, (i, g) in _schema_entries().items():
        value, default = OmegaConf.select(cfg, key), OmegaConf.select(defaults, key)
        if value == default or (g.accept is not None and _accepted(value, g.accept)):
            continue
        if g.reject:
            errors.append(_refusal(key, value, g, default))
        elif user is None or user.touched(key):
            named.setdefault(i, []).append((key, f"{key}={_fmt(value)}"))
    for key, value in (user.ignored if user else {}).items():
        i = _group_index(key)
        assert i is not None, key  # the loader records only keys a group accepts
        g = groups[i]
        if g.accept is None:
            named.setdefault(i, []).append((key, f"{key}={_fmt(value)}"))
        elif not _accepted(value, g.accept):
            errors.append(_refusal(key, value, g, g.accept[0]))
    warnings = []
    for i in sorted(named):
        keys = _compact(named[i])
        verb = "is" if len(keys) == 1 and not keys[0].endswith(" keys)") else "are"
        warnings.append(
            f"{', '.join(keys)} {verb} accepted for verl compatibility and ignored: {groups[i].why}"
        )
    return errors, warnings


BLOCK = 4  # this many keys of one verl-only block in one note are named as the block
SAME_NAME = 8  # this many keys with one last part (verl's _target_ in every block) are named as one

# a note's entry: the key (or what it stands for), its text, how many keys it names
_Entry = tuple[str, str, int]


def _compact(entries: list[tuple[str, str]]) -> list[str]:
    """``key=value`` texts, with every block that dapo's schema lacks and that holds BLOCK or
    more of them named once as ``block.* (N keys)``, and then every last part that SAME_NAME or
    more keys share as ``**.part (N keys)``, so that a pasted verl config lists neither the whole
    critic block nor every ``_target_`` key by key."""
    defaults = _schema_defaults()
    items: list[_Entry] = [(key, text, 1) for key, text in entries]
    while True:
        parents = Counter(key.rsplit(".", 1)[0] for key, _, _ in items if "." in key)
        block = next((b for b, n in parents.items() if n >= BLOCK and not _in_schema(defaults, b)), None)
        if block is None:
            break
        items = _merge(items, lambda key, b=block: key.startswith(b + "."), f"{block}.*")
    while True:
        parts = Counter(key.rsplit(".", 1)[-1] for key, _, n in items if n == 1)
        part = next((t for t, n in parts.items() if n >= SAME_NAME), None)
        if part is None:
            break
        items = _merge(items, lambda key, t=part: key.rsplit(".", 1)[-1] == t, f"**.{part}")
    return [text for _, text, _ in items]


def _merge(items: list[_Entry], member: Callable[[str], bool], name: str) -> list[_Entry]:
    """The entries with those ``member`` accepts replaced, where the first was, by one for all."""
    inside = [i for i, (key, _, _) in enumerate(items) if member(key)]
    total = sum(items[i][2] for i in inside)
    merged = (name, f"{name} ({total} keys)", total)
    return [
        merged if i == inside[0] else it for i, it in enumerate(items) if i == inside[0] or i not in inside
    ]


def _refusal(key: str, value: Any, g: IgnoredGroup, default: Any) -> str:
    return (
        f"{key}={_fmt(value)} is accepted for verl compatibility but not implemented: {g.why}; "
        f"remove it (or set {key}={_fmt(default)})"
    )


# other trainers' names (TRL's GRPOConfig, OpenRLHF's arguments) -> dapo's key
FOREIGN_NAMES: dict[str, str] = {
    # TRL
    "learning_rate": "actor_rollout_ref.actor.optim.lr",
    "num_generations": "actor_rollout_ref.rollout.n",
    "per_device_train_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "gradient_accumulation_steps": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "generation_batch_size": "data.gen_batch_size",
    "max_completion_length": "data.max_response_length",
    "max_prompt_length": "data.max_prompt_length",
    "beta": "actor_rollout_ref.actor.kl_loss_coef (with actor_rollout_ref.actor.use_kl_loss=true)",
    "epsilon": "actor_rollout_ref.actor.clip_ratio_low",
    "epsilon_high": "actor_rollout_ref.actor.clip_ratio_high",
    "num_iterations": "actor_rollout_ref.actor.ppo_epochs",
    "scale_rewards": "algorithm.norm_adv_by_std_in_grpo",
    "loss_type": "actor_rollout_ref.actor.loss_agg_mode",
    "importance_sampling_level": "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
    "max_grad_norm": "actor_rollout_ref.actor.grad_clip",
    "warmup_steps": "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "warmup_ratio": "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "num_train_epochs": "trainer.total_epochs",
    "max_steps": "trainer.total_training_steps",
    "save_steps": "trainer.save_freq",
    "eval_steps": "trainer.test_freq",
    "output_dir": "trainer.default_local_dir",
    "report_to": "trainer.logger",
    "model_name_or_path": "actor_rollout_ref.model.path",
    "reward_weights": "reward_model.objectives (a weight per objective)",
    # OpenRLHF
    "n_samples_per_prompt": "actor_rollout_ref.rollout.n",
    "rollout_batch_size": "data.train_batch_size",
    "micro_train_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "micro_rollout_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "init_kl_coef": "actor_rollout_ref.actor.kl_loss_coef (or algorithm.kl_ctrl.kl_coef for the in-reward KL)",
    "actor_learning_rate": "actor_rollout_ref.actor.optim.lr",
    "generate_max_len": "data.max_response_length",
    "prompt_max_len": "data.max_prompt_length",
    "max_epochs": "actor_rollout_ref.actor.ppo_epochs",
    "num_episodes": "trainer.total_epochs",
    "eps_clip": "actor_rollout_ref.actor.clip_ratio",
    "advantage_estimator": "algorithm.adv_estimator",
    "kl_estimator": "actor_rollout_ref.actor.kl_loss_type",
    "entropy_loss_coef": "actor_rollout_ref.actor.entropy_coeff",
    "pretrain": "actor_rollout_ref.model.path",
    "prompt_data": "data.train_files",
    "input_key": "data.prompt_key",
    "max_norm": "actor_rollout_ref.actor.grad_clip",
    "l2": "actor_rollout_ref.actor.optim.weight_decay",
    "lr_warmup_ratio": "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "dynamic_filtering": "algorithm.filter_groups.enable",
    "packing_samples": "actor_rollout_ref.model.use_remove_padding",
}


def foreign_hint(key: str) -> str | None:
    """dapo's name for another trainer's key (matched on the key's last part), or None."""
    return FOREIGN_NAMES.get(key.split(".")[-1])
