"""The run config is built once, by one pipeline, for `dapo validate` and `dapo train` alike:
what validates runs as validated, resolve and validation run once per `dapo train`, nothing
writes to the config afterwards, every key is documented, and importing dapo.config is light."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from dapo.cli import main
from dapo.config.explain import key_docs
from dapo.config.load import leaf_keys
from dapo.config.schema import DapoConfig
from runs import small_run_args, subprocess_env

ALIAS = "+reward_model.reward_kwargs.overlong_buffer_cfg"


def test_a_partial_overlong_alias_validates_and_trains_with_its_value(
    tmp_path, tiny_random_model_dir, mod3_task, capsys
):
    """verl scripts pass the overlong buffer as reward_kwargs.overlong_buffer_cfg.*: a partial one
    is merged over the preset's buffer (len 8 of 24 tokens, factor 1.0), for validate and train."""
    alias = (f"{ALIAS}.penalty_factor=0.5", f"{ALIAS}.log=true")
    assert main(["validate", *alias]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["reward_model"]
    assert shown["overlong_buffer"] == {"enable": True, "len": 8, "penalty_factor": 0.5, "log": True}
    run, dumps = tmp_path / "run", tmp_path / "val_dumps"
    args = small_run_args(
        run, tiny_random_model_dir, mod3_task, 1, *alias, f"trainer.validation_data_dir={dumps}"
    )
    assert main(args) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())["reward_model"]
    assert saved["overlong_buffer"] == shown["overlong_buffer"]
    assert "overlong_buffer_cfg" not in saved["reward_kwargs"]
    # the reward used it: a penalty grows over the 8-token buffer up to the factor, 0.5 (not 1.0)
    rows = [json.loads(line) for f in sorted(dumps.glob("*.jsonl")) for line in f.read_text().splitlines()]
    penalties = [r["overlong_reward"] for r in rows]
    assert rows and min(penalties) >= -0.5 and any(p < -0.25 for p in penalties), penalties


def test_an_alias_that_disagrees_is_refused_by_validate_and_train_alike(tmp_path, capsys):
    bad = [f"{ALIAS}.len=4", "reward_model.overlong_buffer.len=6"]
    assert main(["validate", *bad]) == 2
    said = capsys.readouterr().err
    assert main(["train", *bad, f"trainer.default_local_dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err == said
    (line,) = said.splitlines()  # one problem, one line
    assert "overlong_buffer_cfg.len=4 and reward_model.overlong_buffer.len=6 are both set" in line
    assert not (tmp_path / "run").exists()


def _count_calls(monkeypatch, module, name: str) -> list[int]:
    """Count every call of ``module.name``, under each name any loaded module holds it by."""
    original, calls = getattr(module, name), []

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    for mod in list(sys.modules.values()):
        for attr, value in list(vars(mod).items()) if mod is not None else []:
            if value is original:
                monkeypatch.setattr(mod, attr, counted)
    return calls


def test_train_resolves_and_validates_once_and_never_writes_the_config(
    tmp_path, tiny_random_model_dir, mod3_task, monkeypatch
):
    import dapo.trainer.loop

    resolves = _count_calls(monkeypatch, dapo.config.resolve, "resolve")
    validates = _count_calls(monkeypatch, dapo.config.validate, "validate")
    given: list = []
    trainer_init = dapo.trainer.loop.Trainer.__init__

    def keep(self, cfg, *args, **kwargs):
        given.append((cfg, dataclasses.asdict(cfg)))
        trainer_init(self, cfg, *args, **kwargs)

    monkeypatch.setattr(dapo.trainer.loop.Trainer, "__init__", keep)
    assert main(small_run_args(tmp_path / "run", tiny_random_model_dir, mod3_task, 1)) == 0
    assert (len(resolves), len(validates)) == (1, 1)
    ((cfg, before),) = given
    assert isinstance(cfg, DapoConfig) and dataclasses.asdict(cfg) == before  # nothing wrote to it


def test_every_schema_key_has_an_explain_text():
    """Adding a key is one edit: the field with its comment above it in dapo.config.schema (or
    dapo.config.sampling); this finds a key without its comment."""
    from omegaconf import OmegaConf

    import dapo.config.schema as schema

    docs = key_docs()
    leaves = [k for k in leaf_keys(OmegaConf.structured(DapoConfig)) if k not in _blocks()]
    assert sorted(docs) == sorted(leaves)
    missing = [k for k, text in docs.items() if not text.strip()]
    assert missing == [], f"add a comment above each of these fields in {schema.__file__}: {missing}"


def _blocks() -> set[str]:
    """Keys that hold a nested block rather than a value."""
    out = set()

    def walk(cls: type, prefix: str) -> None:
        import typing

        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                out.add(prefix + f.name)
                walk(hints[f.name], prefix + f.name + ".")

    walk(DapoConfig, "")
    return out


@pytest.mark.parametrize(
    "module", ["load", "resolve", "validate", "explain", "compat", "schema", "sampling", "pipeline"]
)
def test_importing_config_loads_no_consumer_and_no_torch(module):
    heavy = ["torch", "transformers", "vllm"] + [
        f"dapo.{p}" for p in ("tasks", "tools", "reward", "rollout", "model", "trainer", "data", "algo")
    ]
    code = (
        f"import sys, dapo.config.{module}; "
        f"print([m for m in {heavy!r} if m in sys.modules or any(k.startswith(m + '.') for k in sys.modules)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
