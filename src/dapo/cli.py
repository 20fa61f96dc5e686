"""``dapo``: train | validate | eval | data | preprocess | bench."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dapo.config.load import DEFAULT_PRESET, ConfigError, load_config, preset_names, to_yaml


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config-name",
        "-c",
        default=DEFAULT_PRESET,
        help=f"preset name ({', '.join(preset_names())}) or a yaml file (default: {DEFAULT_PRESET})",
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides with verl's dotted keys")


def _load(args: argparse.Namespace):
    from dapo.config.validate import validate

    cfg = load_config(args.overrides, preset=args.config_name)
    problems = validate(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    print(to_yaml(cfg), end="")
    print("# configuration OK", file=sys.stderr)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dapo import rundir

    # soft_wrap: one line per step in logs too (a non-terminal console is 80 columns wide)
    console = Console(stderr=False, highlight=False, soft_wrap=True)
    cfg = _load(args)
    # one dapo train per run directory at a time; the kernel drops the lock when this process ends
    with rundir.RunLock(rundir.run_dir_of(cfg)):
        try:
            summary = _train_locked(cfg, console)
        except rundir.RunFinished as e:
            console.print(str(e))
            return 0
    before, after = summary.get("val_acc_before"), summary.get("val_acc_after")
    if summary.get("stopped"):
        console.print(f"stopped at step {summary['steps']}; run the same command again to resume")
        return 130 if summary.get("stopped_by") == "SIGINT" else 0
    console.print(f"[bold]done[/bold] in {summary['wall_time_s']:.0f}s, {summary['steps']} steps")
    if before is not None and after is not None:
        console.print(
            f"held-out accuracy: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)"
        )
    console.print(f"run directory: {summary['run_dir']}")
    return 0


def _train_locked(cfg: Any, console: Any) -> dict[str, Any]:
    from dapo import rundir
    from dapo.checkpoint import list_checkpoints
    from dapo.trainer import Trainer

    tr = cfg.trainer
    if not tr.val_only:
        run_dir = rundir.run_dir_of(cfg)
        has_ckpt = tr.resume_mode == "resume_path" or bool(list_checkpoints(run_dir, complete_only=False))
        rundir.check_finished(run_dir, cfg, has_ckpt)
        rundir.clear_finished(run_dir)
    summary = Trainer(cfg, printer=console.print).fit()
    if not tr.val_only and not summary.get("stopped") and summary["steps"] >= summary["total_training_steps"]:
        rundir.mark_finished(rundir.run_dir_of(cfg), cfg, summary["steps"])
    return summary


def cmd_eval(args: argparse.Namespace) -> int:
    """Validation alone on a model directory (or a checkpoint's model), printing val-core metrics."""
    from rich.console import Console

    from dapo.trainer import Trainer

    overrides = list(args.overrides)
    if args.model:
        from dapo.checkpoint import MANIFEST, hf_model_dir, verify_checkpoint

        if (Path(args.model) / MANIFEST).exists():  # a global_step_N checkpoint: check it is whole
            verify_checkpoint(args.model, warn=lambda msg: print(f"dapo: warning: {msg}", file=sys.stderr))
        model = hf_model_dir(args.model)  # a model directory, or a global_step_N checkpoint
        overrides.append(f"actor_rollout_ref.model.path={model}")
    # evaluation scores the model it is given: a checkpoint in the run directory never loads over it
    overrides += ["trainer.val_only=true", "trainer.logger=[console]", "trainer.resume_mode=disable"]
    args.overrides = overrides
    cfg = _load(args)
    console = Console(highlight=False, soft_wrap=True)
    trainer = Trainer(cfg, printer=console.print)
    metrics = trainer.validate()
    for k in sorted(metrics):
        if k.startswith("val-core/") or k == "val/acc":
            print(f"{k} = {metrics[k]:.6f}")
    return 0


def cmd_data_arithmetic(args: argparse.Namespace) -> int:
    from dapo.data.builtin import write_task

    train, test = write_task(
        args.output, train_size=args.train_size, test_size=args.test_size, seed=args.seed
    )
    print(json.dumps({"train": str(train), "test": str(test)}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train with DAPO (dynamic sampling) on the given config")
    _add_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("validate", help="check a configuration and print it resolved; runs nothing")
    _add_config_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("eval", help="run validation alone on a model directory or checkpoint")
    p.add_argument("--model", help="a Hugging Face model directory (e.g. RUN_DIR/final_model) or checkpoint")
    _add_config_args(p)
    p.set_defaults(func=cmd_eval)

    data = sub.add_parser("data", help="data utilities").add_subparsers(dest="data_command", required=True)
    p = data.add_parser("arithmetic", help="write the built-in arithmetic task as verl parquet")
    p.add_argument("--output", required=True)
    p.add_argument("--train-size", type=int, default=1200)
    p.add_argument("--test-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_data_arithmetic)
    _register_optional(data, "dapo.data.check")
    _register_optional(data, "dapo.data.builtin_chat")

    _register_optional(sub, "dapo.data.preprocess")
    _register_optional(sub, "dapo.viewer")
    _register_optional(sub, "dapo.model.gguf")
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", required=True)
    _register_optional(bench, "dapo.sampling.simulate")
    _register_optional(bench, "dapo.bench.rollout")
    _register_optional(bench, "dapo.bench.update")
    return parser


def _register_optional(subparsers: argparse._SubParsersAction, module: str) -> None:
    """Commands whose module exposes ``register(subparsers)``."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return
    register: Callable | None = getattr(mod, "register", None)
    if register is not None:
        register(subparsers)


def main(argv: list[str] | None = None) -> int:
    from dapo.signals import guarded_console

    # a closed pipe or terminal on stdout/stderr never kills a command (dapo train then saves and stops)
    with guarded_console():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    import logging

    from dapo.checkpoint import CheckpointError
    from dapo.rundir import RunDirError
    from dapo.tracking import TrackerUnavailable
    from dapo.trainer import TrainingError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"dapo: {e}", file=sys.stderr)
        return 2
    except (TrackerUnavailable, CheckpointError, TrainingError, RunDirError) as e:
        print(f"dapo: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dapo: interrupted", file=sys.stderr)
        return 130
    except ValueError as e:  # DataError, ModelError and friends carry their own fix-it text
        from dapo.data.parquet import DataError
        from dapo.model.loader import ModelError

        if isinstance(e, DataError | ModelError):
            print(f"dapo: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
