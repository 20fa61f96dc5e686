"""dapo: RL post-training of language models on verifiable rewards (DAPO, verl's config keys)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from dapo.config.load import DEFAULT_PRESET, ConfigError, preset_names, to_yaml
from dapo.errors import DapoError, ModelError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config-name",
        "-c",
        default=DEFAULT_PRESET,
        help=f"preset name ({', '.join(preset_names())}) or a yaml file (default: {DEFAULT_PRESET})",
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides with verl's dotted keys")


EPILOG = """\
commands, with an example each:
  train       dapo train                                  (the built-in demo: tiny model, CPU, a few minutes)
              dapo train -c smollm2 trainer.total_training_steps=4
  validate    dapo validate data.train_batch_size=64      (check a config, print what the run will use)
              dapo validate --explain actor_rollout_ref.actor   (each key: value, default, meaning)
  eval        dapo eval --model RUN_DIR/final_model        (held-out metrics of a saved model)
  data        dapo data arithmetic --output data/          (write the built-in task as verl parquet)
  preprocess  dapo preprocess gsm8k --input gsm8k.jsonl --output data/   (your data file to verl parquet)
  bench       dapo bench sampling --json                  (dynamic-sampling simulation, no model)
  view        dapo view RUN_DIR                            (browse a run's rollout dumps in the terminal)
  report      dapo report RUN_DIR                          (a run's HTML report: sampling, lengths, timing)
  model       dapo model import FILE.gguf --output DIR     (a GGUF file to a Hugging Face directory)
`dapo COMMAND --help` describes each one.
"""

KEYS_HELP = (
    "configuration: verl's dotted keys as key=value overrides on a preset; "
    "`dapo validate --explain [PREFIX]` lists every key with its default, the value the run "
    "uses and its meaning (e.g. `dapo validate --explain algorithm.filter_groups`)"
)


def _fit_terminal(line: str, stream) -> str:
    """On a terminal, ``line`` broken between words at its width; elsewhere unchanged."""
    if not stream.isatty():
        return line
    import shutil
    import textwrap

    return textwrap.fill(line, width=shutil.get_terminal_size().columns - 1, subsequent_indent="  ")


def _load(args: argparse.Namespace, warn: bool = True, extra_rules: tuple = ()):
    """The config of a command line as given and as the run uses it (built once, every rule
    checked: dapo.run_config, and ``extra_rules``); every problem is reported at once."""
    from dapo.run_config import build_run_config

    run = build_run_config(args.overrides, preset=args.config_name, extra_rules=extra_rules)
    if warn:
        for w in run.warnings:
            print(_fit_terminal(f"note: {w}", sys.stderr), file=sys.stderr)
    return run.loaded, run.cfg


def _vllm_head_size_problems(cfg: Any) -> list[str]:
    if cfg.actor_rollout_ref.rollout.name != "vllm" or cfg.actor_rollout_ref.model.path is None:
        return []  # the built-in model is every run's rule (dapo.tasks); torch stays unimported
    from dapo.rollout.vllm_rollout import model_head_size_problems

    return model_head_size_problems(cfg)


def cmd_validate(args: argparse.Namespace) -> int:
    from dapo.config.machine import machine_problems

    # the data files, model and device are checked on this machine, except when explaining keys
    rules = () if args.explain is not None else (machine_problems, _vllm_head_size_problems)
    loaded, cfg = _load(args, extra_rules=rules)
    if args.explain is not None:
        from dapo.config.explain import explain

        try:
            print(explain(loaded, cfg, args.explain))
        except KeyError:
            raise ConfigError(
                [f"--explain {args.explain}: no key starts with it; try --explain with no prefix"]
            ) from None
        return 0
    print(to_yaml(cfg), end="")
    print("# configuration OK (values derived from other keys are filled in)", file=sys.stderr)
    return 0


def _console():
    """The console a run prints to: on a terminal, long lines wrap between words at its width;
    elsewhere (a log file, a pipe) every line stays one line."""
    from rich.console import Console

    console = Console(highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def cmd_train(args: argparse.Namespace) -> int:
    from dapo.outputs import rundir
    from dapo.outputs.progress import logging_through

    console = _console()
    # one dapo train per run directory at a time (the kernel drops the lock when this process
    # ends), claimed before the component rules import torch and before anything loads, so a
    # second train into a busy directory is refused at once
    with rundir.RunLock(_run_dir_as_given(args)) as lock, logging_through(console):
        _, cfg = _load(args)
        if rundir.run_dir_of(cfg) != lock.run_dir:
            raise RuntimeError(f"locked {lock.run_dir}, but the run config names {rundir.run_dir_of(cfg)}")
        try:
            summary = _train_locked(cfg, console)
        except rundir.RunFinished as e:
            console.print(str(e))
            return 0
    before, after = summary.get("val_acc_before"), summary.get("val_acc_after")
    if summary.get("stopped"):
        console.print(f"stopped at step {summary['steps']}; run the same command again to resume")
        return 130 if summary.get("stopped_by") == "SIGINT" else 0
    if summary["steps_run"] > 0 and summary["updates"] == 0:
        console.print(
            f"[bold red]nothing was trained[/bold red]: {summary['steps_run']} steps ran and none made a "
            "policy update (every step's batch was empty: see the 'no update' lines above). Check that "
            "the model can ever answer right (dynamic sampling drops groups that are all wrong), add "
            "data, or set algorithm.filter_groups.enable=false"
        )
        console.print(f"run directory: {summary['run_dir']}")
        return 1
    console.print(
        f"[bold]done[/bold] in {summary['wall_time_s']:.0f} seconds at step {summary['steps']}: "
        f"{summary['updates']} policy updates in the {summary['steps_run']} steps this run made"
    )
    if before is not None and after is not None:
        console.print(
            f"held-out accuracy: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)"
        )
    console.print(f"run directory: {summary['run_dir']}")
    return 0


def _run_dir_as_given(args: argparse.Namespace) -> Path:
    """The run directory of a command line, from its config as given (preset and overrides
    merged, nothing else run): cheap enough to lock before the config is built."""
    from dapo.config.load import load_config
    from dapo.outputs import rundir

    problems: list[str] = []
    loaded = load_config(list(args.overrides), preset=args.config_name, problems=problems)
    if problems:
        _, cfg = _load(args)  # raises ConfigError naming every problem
        return rundir.run_dir_of(cfg)
    return rundir.run_dir_of(loaded)


def _train_locked(cfg: Any, console: Any) -> dict[str, Any]:
    """Train in the locked run directory. Every refusal comes before anything in it is changed:
    the finished marker is cleared only once the trainer has accepted the command (resumed from
    its checkpoint, or started without one)."""
    from dapo.checkpoint.store import list_checkpoints
    from dapo.outputs import rundir
    from dapo.trainer.loop import Trainer

    tr = cfg.trainer
    run_dir = rundir.run_dir_of(cfg)
    if not tr.val_only:
        checkpoints = [p for _, p in reversed(list_checkpoints(run_dir, complete_only=False))]
        has_ckpt = tr.resume_mode == "resume_path" or bool(checkpoints)
        rundir.check_finished(run_dir, cfg, has_ckpt)
        _check_resume_config_early(cfg, checkpoints)
    trainer = Trainer(cfg, printer=console.print, console=console)
    if not tr.val_only:
        rundir.clear_finished(run_dir)
    summary = trainer.fit()
    if not tr.val_only and not summary.get("stopped") and summary["steps"] >= summary["total_training_steps"]:
        rundir.mark_finished(run_dir, cfg, summary["steps"])
    return summary


def _check_resume_config_early(cfg: Any, checkpoints: list[Path]) -> None:
    """The resume's config check against the checkpoint a resume starts from (``checkpoints``:
    the run directory's, newest first), before the model and data load: a command that changes
    training is refused at once. The trainer checks again on the checkpoint it loads."""
    from dapo.checkpoint.manifest import STATE_FILE
    from dapo.outputs import rundir

    tr = cfg.trainer
    if tr.resume_allow_config_change or tr.resume_mode == "disable":
        return
    if tr.resume_mode == "resume_path":
        checkpoints = [Path(tr.resume_from_path).expanduser()] if tr.resume_from_path else []
    free = rundir.FREE_KEYS
    if tr.total_training_steps is None:  # the warmup is derived from the step count, once the data loads
        free += ("actor_rollout_ref.actor.optim.lr_warmup_steps",)
    for path in checkpoints:
        try:
            state = json.loads((path / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue  # a damaged checkpoint: the resume skips it, or says why it cannot
        saved = state.get("config") if isinstance(state, dict) else None
        rundir.check_resume_config(path, saved if isinstance(saved, dict) else None, cfg, free)
        return


def cmd_eval(args: argparse.Namespace) -> int:
    """Validation alone on a model directory (or a checkpoint's model), printing val-core metrics."""
    from dapo.trainer.loop import Trainer

    overrides = list(args.overrides)
    if args.model:
        from dapo.checkpoint.store import MANIFEST, checkpoint_step, hf_model_dir, verify_checkpoint

        # a checkpoint (a manifest, or named global_step_N: without one it was cut off): check it is whole
        if (Path(args.model) / MANIFEST).exists() or checkpoint_step(args.model) is not None:
            verify_checkpoint(args.model, warn=lambda msg: print(f"dapo: warning: {msg}", file=sys.stderr))
        model = hf_model_dir(args.model)  # a model directory, or a global_step_N checkpoint
        if not (model / "config.json").is_file():
            what = "does not exist" if not Path(args.model).exists() else "is not a model directory"
            raise ModelError(
                f"--model {args.model}: {what} (a directory with config.json, or a global_step_N "
                "checkpoint holding one); give the model directory or checkpoint to score"
            )
        overrides.append(f"actor_rollout_ref.model.path={model}")
    # evaluation scores the model it is given: a checkpoint in the run directory never loads over it
    overrides += ["trainer.val_only=true", "trainer.logger=[console]", "trainer.resume_mode=disable"]
    args.overrides = overrides
    _, cfg = _load(args, warn=False)
    console = _console()
    trainer = Trainer(cfg, printer=console.print, console=console)
    metrics = trainer.validate()
    for k in sorted(metrics):
        if k.startswith("val-core/") or k == "val/acc":
            print(f"{k} = {metrics[k]:.6f}")
    return 0


def cmd_data_arithmetic(args: argparse.Namespace) -> int:
    from dapo.tasks.arithmetic import write_task

    out = Path(args.output).expanduser()
    if out.exists() and not out.is_dir():
        raise DapoError(
            f"--output {args.output}: is a file; give a directory (train.parquet and test.parquet "
            "are written into it)"
        )
    train, test = write_task(
        args.output, train_size=args.train_size, test_size=args.test_size, seed=args.seed
    )
    print(json.dumps({"train": str(train), "test": str(test)}))
    return 0


class _Subcommands(argparse._SubParsersAction):
    """Subcommands, some of them added by another module's ``register(subparsers)``: that module
    is imported only when its command is on the command line, so listing the commands (``dapo
    --help``, ``dapo bench --help``) imports none of them, and a command pays only for its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._modules: dict[str, str] = {}

    def add_from(self, module: str, name: str, help: str) -> None:
        """``name`` (listed with ``help``), defined by ``module.register(subparsers)``."""
        self.add_parser(name, help=help)  # stands in until the command is chosen
        self._modules[name] = module

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        module = self._modules.pop(values[0], None)
        if module is not None:
            scratch = argparse.ArgumentParser(prog=self._prog_prefix).add_subparsers()
            importlib.import_module(module).register(scratch)
            self.choices[values[0]] = scratch.choices[values[0]]
        super().__call__(parser, namespace, values, option_string)


def _subcommands(parser: argparse.ArgumentParser, dest: str, **kwargs: Any) -> _Subcommands:
    return parser.add_subparsers(dest=dest, required=True, action=_Subcommands, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The ``dapo`` command line; builds from this module alone (no model code is imported)."""
    parser = argparse.ArgumentParser(
        prog="dapo", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = _subcommands(parser, "command", metavar="COMMAND")

    p = sub.add_parser(
        "train",
        help="train with DAPO (dynamic sampling) on the given config",
        description="Train with DAPO on a preset plus key=value overrides. " + KEYS_HELP,
        epilog="example: dapo train data.train_files=train.parquet actor_rollout_ref.model.path=MODEL_DIR",
    )
    _add_config_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "validate",
        help="check a configuration and print what the run will use; runs nothing",
        description="Check a configuration (every problem at once) and print it with derived values "
        "filled in. " + KEYS_HELP,
    )
    p.add_argument(
        "--explain",
        nargs="?",
        const="",
        default=None,
        metavar="PREFIX",
        help="list each key (under PREFIX) with its value, default and meaning instead of the yaml",
    )
    _add_config_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("eval", help="run validation alone on a model directory or checkpoint")
    p.add_argument("--model", help="a Hugging Face model directory (e.g. RUN_DIR/final_model) or checkpoint")
    _add_config_args(p)
    p.set_defaults(func=cmd_eval)

    data = _subcommands(sub.add_parser("data", help="data utilities"), "data_command")
    p = data.add_parser("arithmetic", help="write the built-in arithmetic task as verl parquet")
    p.add_argument("--output", required=True)
    p.add_argument("--train-size", type=int, default=1200)
    p.add_argument("--test-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_data_arithmetic)
    data.add_from("dapo.data.check", "check", "find schema problems by row; summarise the file")
    data.add_from(
        "dapo.tasks.arithmetic_chat",
        "arithmetic-chat",
        "write the built-in chat-form arithmetic word problems as verl parquet",
    )

    sub.add_from("dapo.data.preprocess", "preprocess", "convert a data file to verl-format parquet")
    sub.add_from("dapo.viewer", "view", "browse rollout / validation dumps in the terminal")
    sub.add_from(
        "dapo.viewer",
        "report",
        "write an HTML report (sampling heatmaps, rounds, lengths, validation, timing) of a run",
    )
    sub.add_from("dapo.model.gguf", "model", "model utilities (GGUF import)")
    bench = _subcommands(sub.add_parser("bench", help="benchmarks"), "bench_command")
    bench.add_from(
        "dapo.sampling.simulate",
        "sampling",
        "simulate each dynamic-sampling strategy on a synthetic drifting population",
    )
    bench.add_from("dapo.bench.rollout", "rollout", "our rollout engine vs model.generate")
    bench.add_from(
        "dapo.bench.update", "update", "log-prob / update tokens/s: packed and dynamic bsz vs padded"
    )
    bench.add_from(
        "dapo.bench.cluster",
        "cluster",
        "a step-time model: calibrated here, checked on verl's async ratio, GPU predictions",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from dapo.trainer.signals import guarded_console

    # a closed pipe or terminal on stdout/stderr never kills a command (dapo train then saves and stops)
    with guarded_console():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DapoError as e:  # bad input or a stopped run: the message names what and how to fix it
        print(f"dapo: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dapo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
