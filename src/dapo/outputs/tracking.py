"""Trackers: where per-step metrics go (``trainer.logger``, a list).

* ``console``: a legend once, then a line per step and readable validation lines (the live
  progress bar is :mod:`dapo.outputs.progress`).
* ``jsonl``: ``<run_dir>/metrics.jsonl``, one object per step.
* ``tensorboard``: event files under ``<run_dir>/tensorboard`` (extra ``dapo[tensorboard]``).
* ``wandb``: offline unless ``WANDB_MODE`` says otherwise, files under ``<run_dir>/wandb``
  (extra ``dapo[wandb]``; ``wandb sync <run_dir>/wandb/offline-run-*`` uploads later).
* ``mlflow``: a local file store ``<run_dir>/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set
  (extra ``dapo[mlflow]``; ``mlflow ui --backend-store-uri <run_dir>/mlruns`` shows it).

wandb and mlflow remember their run id in the run directory, so a resumed run keeps logging
into the same wandb / mlflow run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from dapo.atomic import write_text
from dapo.errors import DapoError
from dapo.outputs.rundir import RERUN

AVAILABLE = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


class TrackerUnavailable(DapoError, ImportError):
    """A tracker whose optional package is not installed; the message names the extra."""


def _require(module: str, tracker: str, extra: str | None = None) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra = extra or tracker
        raise TrackerUnavailable(
            f"trainer.logger={tracker} needs the {extra!r} package, which is not installed: "
            f"pip install 'dapo[{extra}]' (or remove {tracker} from trainer.logger). ({e})"
        ) from e


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric metrics as floats (bools count; None, strings and containers are left out)."""
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
            v = v.item()
        if isinstance(v, bool | int | float):
            out[k] = float(v)
    return out


class Tracker(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None: ...
    def close(self) -> None: ...


class JsonlTracker:
    """``metrics.jsonl`` in the run directory: one object per step with ``step`` and every metric.

    The file is opened at the first row (a resume first drops the rows logged after its
    checkpoint, see :mod:`dapo.outputs.rundir`), and each row is on disk (fsynced) when ``log`` returns.
    """

    def __init__(self, run_dir: Path, filename: str = "metrics.jsonl"):
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: Any = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._f is None:
            self._f = self.path.open("a", encoding="utf-8")
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._f.write(json.dumps(row, sort_keys=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# The per-step console line: (metric, label, format); "groups" and "filtered" are built apart
CONSOLE_FIELDS = (
    ("train/num_gen_batches", "rounds", "{:.0f}"),
    ("dynamic_sampling/kept_groups", "kept", "{:.0f}"),
    ("dynamic_sampling/skipped_prompts", "skipped", "{:.0f}"),
    ("train/acc_generated", "acc(all)", "{:.3f}"),
    ("train/acc", "acc(kept)", "{:.3f}"),
    ("critic/score/mean", "score", "{:+.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/pg_loss", "pg_loss", "{:+.4f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("timing_s/step", "time", "{:.1f} s"),
)

# printed once, before the first step line; every line fits an 80-column terminal
LEGEND = (
    "each step line:",
    "  rounds     generation rounds (up to data.gen_batch_size prompts in each)",
    "  groups     prompts trained on = new (kept this step) + carried (kept in an",
    "             earlier step, waiting in the pool); their sum is the train batch",
    "  kept       groups kept this step; those beyond the batch wait in the pool",
    "  filtered   groups dropped: every response right / every response wrong",
    "  skipped    draws of a prompt not rolled out (the prompt history marked it",
    "             hopeless); a step that skips most prompts draws its data many",
    "             times over, and then says how many passes over how many prompts",
    "  acc(all)   fraction right over ALL responses generated this step (compare",
    "             this one with other trainers' accuracy)",
    "  acc(kept)  fraction right over the trained groups only: filtering keeps the",
    "             groups with a mix, so it differs from acc(all)",
    "  score      mean reward of the trained responses (overlong penalty included)",
    "  len        mean response length in tokens; time: seconds for the step",
    "validation: accuracy is the mean over k samples per prompt; best / majority",
    "  of k count a prompt right when any / the most common answer of k is right",
)


def _field_lines(fields: list[str], width: int | None, sep: str = " | ", indent: str = "    ") -> list[str]:
    """``fields`` joined by ``sep`` into lines shorter than ``width`` (None: one line); a line
    breaks only between fields, so no word is split by the terminal."""
    if not width:
        return [sep.join(fields)]
    lines: list[str] = []
    cur = ""
    for f in fields:
        if not cur:
            cur = (indent if lines else "") + f
        elif len(cur) + len(sep) + len(f) < width:
            cur += sep + f
        else:
            lines.append(cur)
            cur = indent + f
    if cur:
        lines.append(cur)
    return lines


def step_fields(step: int, metrics: Mapping[str, Any]) -> list[str]:
    """The fields of the console's line for one training step (see ``LEGEND``)."""
    parts = [f"step {step}"]
    have = {k: v for k, v in metrics.items() if v is not None}
    for key, label, fmt in CONSOLE_FIELDS:
        if key == "dynamic_sampling/kept_groups" and "dynamic_sampling/trained_groups" in have:
            trained = int(have["dynamic_sampling/trained_groups"])
            carried = int(have.get("dynamic_sampling/carried_in", 0))
            parts.append(f"groups {trained} = {trained - carried} new + {carried} carried")
        if key == "dynamic_sampling/skipped_prompts":
            if "dynamic_sampling/filtered_all_correct" in have:
                right = int(have["dynamic_sampling/filtered_all_correct"])
                wrong = int(have.get("dynamic_sampling/filtered_all_wrong", 0))
                parts.append(f"filtered {right} right/{wrong} wrong")
            if not have.get(key):
                continue  # skipping prompts is off, or skipped none
            parts.append(skipped_field(have))
            continue
        if key in have:
            parts.append(f"{label} {fmt.format(have[key])}")
    return parts


def skipped_field(metrics: Mapping[str, Any]) -> str:
    """``skipped N``; when the step drew more prompts than the pool holds (it skipped most of them
    and passed over the data again), ``skipped N draws (P passes over M prompts)``, so a count
    far above the data's size reads as what it is."""
    skipped = int(metrics["dynamic_sampling/skipped_prompts"])
    cov = "dynamic_sampling/coverage/"
    if cov + "never_rolled_out" not in metrics or cov + "rolled_out_prompts" not in metrics:
        return f"skipped {skipped}"
    pool = int(metrics[cov + "rolled_out_prompts"] + metrics[cov + "never_rolled_out"])
    drawn = skipped + int(metrics.get("dynamic_sampling/generated_groups", 0))
    if pool <= 0 or drawn <= pool:
        return f"skipped {skipped}"
    passes = drawn / pool
    return f"skipped {skipped} draws ({passes:.{1 if passes < 10 else 0}f} passes over {pool} prompts)"


_VAR_NAMES = {"acc": "accuracy", "reward": "reward", "score": "score"}


def _split_val_key(key: str) -> tuple[str, str, str] | None:
    """``val-core/<data source>/<variable>/<metric>`` -> (source, variable, metric); a source may
    contain ``/`` and a metric is ``mean@N`` or ``best@k/mean``."""
    parts = key.split("/")[1:]
    n_metric = 2 if len(parts) >= 4 and parts[-1] in ("mean", "std") and "@" in parts[-2] else 1
    if len(parts) < n_metric + 2:
        return None
    return "/".join(parts[: -n_metric - 1]), parts[-n_metric - 1], "/".join(parts[-n_metric:])


def validation_fields(metrics: Mapping[str, Any]) -> list[list[str]]:
    """Readable console fields for the ``val-core/`` metrics, one list per data source:
    ``accuracy 0.250 (mean of 4)``, ``best of 4 0.500``, ``majority of 4 0.312`` (bootstrap
    standard deviations stay in the metrics)."""
    by_source: dict[str, list[tuple[int, str]]] = {}
    for k in sorted(metrics):
        v = metrics[k]
        if not k.startswith("val-core/") or v is None:
            continue
        split = _split_val_key(k)
        if split is None:
            by_source.setdefault("", []).append((9, f"{k} {v:.3f}"))
            continue
        source, var, metric = split
        name, _, rest = metric.partition("@")
        n, _, stat = rest.partition("/")
        what = _VAR_NAMES.get(var, var)
        if stat == "std":
            continue
        if name == "mean":
            field = (0, f"{what} {v:.3f} (mean of {n})")
        elif name in ("best", "maj", "worst"):
            label = {"best": "best", "maj": "majority", "worst": "worst"}[name]
            field = (1 if name == "best" else 2, f"{label} of {n} {v:.3f}")
        else:
            field = (9, f"{var} {metric} {v:.3f}")
        by_source.setdefault(source, []).append(field)
    out = []
    for source, fields in by_source.items():
        texts = [f for _, f in sorted(fields)]
        out.append([f"validation{' ' + source if source else ''}: {texts[0]}", *texts[1:]])
    return out


class ConsoleTracker:
    """A line per step (fields listed once in a legend) and readable validation lines. With a
    ``width`` (a terminal's columns), lines break between fields to fit it."""

    def __init__(self, printer: Any, width: Any = None):
        self.print = printer
        self.width = width  # an int, or a callable giving the terminal's current width
        self._legend_shown = False

    def _width(self) -> int | None:
        return self.width() if callable(self.width) else self.width

    def log(self, metrics: dict[str, Any], step: int) -> None:
        width = self._width()
        val = validation_fields(metrics)
        if "train/num_gen_batches" in metrics or "actor/pg_loss" in metrics or not val:
            if not self._legend_shown:
                self._legend_shown = True
                for line in LEGEND:
                    self.print(line)
            for line in _field_lines(step_fields(step, metrics), width):
                self.print(line)
            indent = "  "
        else:
            indent = ""
            val = [[f"step {step} {fields[0]}", *fields[1:]] for fields in val]
        for fields in val:
            for line in _field_lines(fields, width - len(indent) if width else None):
                self.print(indent + line)

    def close(self) -> None:
        pass


class TensorboardTracker:
    """Scalars into tensorboard event files under ``<run_dir>/tensorboard`` (flushed every step)."""

    def __init__(self, run_dir: Path, subdir: str = "tensorboard"):
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / subdir
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for k, v in _scalars(metrics).items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _read_id(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


class WandbTracker:
    """A wandb run: offline (no network) unless ``WANDB_MODE`` is set; files in ``<run_dir>/wandb``."""

    ID_FILE = "wandb_run_id.txt"

    def __init__(
        self,
        run_dir: Path,
        project: str,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        mode: str | None = None,
    ):
        wandb = _require("wandb", "wandb")
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.mode = mode or os.environ.get("WANDB_MODE") or "offline"
        id_file = run_dir / self.ID_FILE
        run_id = _read_id(id_file) or secrets.token_hex(4)
        self.run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=self.mode,
            config=dict(config) if config else None,
            settings=wandb.Settings(console="off", silent=True),
        )
        id_file.write_text(run_id + "\n")
        self.run_id = run_id

    def log(self, metrics: dict[str, Any], step: int) -> None:
        data = {k: v for k, v in metrics.items() if v is not None}
        self.run.log(data, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() returns before wandb's service process has written the run's files; tearing
        # the service down waits for that, so the offline run is complete when close() returns
        wandb.teardown()


_MLFLOW_BAD = re.compile(r"[^\w\-. :/]")


def mlflow_key(key: str) -> str:
    """A metric name mlflow accepts: ``@`` becomes ``_at_``, other disallowed characters ``_``."""
    return _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))


class MlflowTracker:
    """An mlflow run in a local file store ``<run_dir>/mlruns`` (or ``MLFLOW_TRACKING_URI``).

    Metric names are made mlflow-safe with :func:`mlflow_key` (``mean@4`` -> ``mean_at_4``).
    """

    ID_FILE = "mlflow_run_id.txt"

    def __init__(
        self,
        run_dir: Path,
        experiment: str,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        tracking_uri: str | None = None,
    ):
        _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = (
            tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        )
        if self.tracking_uri.startswith("file:"):
            # mlflow >= 3.x keeps the file store in maintenance mode behind this opt-in; it is the
            # dependency-free local store (set MLFLOW_TRACKING_URI=sqlite:///... for a database)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        id_file = run_dir / self.ID_FILE
        run_id = _read_id(id_file)
        if run_id is not None:
            try:
                self.client.get_run(run_id)
            except Exception:  # the store was moved or cleaned: start a new run
                run_id = None
        if run_id is None:
            run = self.client.create_run(exp_id, run_name=run_name)
            run_id = run.info.run_id
            if config:
                self.client.log_dict(run_id, _jsonable_tree(config), "config.json")
            id_file.write_text(run_id + "\n")
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.experiment_id = exp_id

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(mlflow_key(k), v, ts, int(step)) for k, v in _scalars(metrics).items()]
        for i in range(0, len(items), 1000):  # mlflow's per-call limit
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _jsonable_tree(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable_tree(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable_tree(x) for x in v]
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(v)


def replay(trackers: list[Tracker], metrics: dict[str, Any], step: int) -> None:
    """Log a step's row again to every tracker but the console (a resume whose checkpoint was
    saved just before the run was killed, before the row was written)."""
    for t in trackers:
        if not isinstance(t, ConsoleTracker):
            t.log(metrics, step)


def build_trackers(
    names: list[str],
    run_dir: Path,
    printer: Any,
    *,
    console_width: Any = None,
    project_name: str = "dapo",
    experiment_name: str | None = None,
    config: Any = None,
) -> list[Tracker]:
    """The trackers named in ``trainer.logger``; a tracker whose package is missing raises
    :class:`TrackerUnavailable` naming the extra to install, before any training starts.
    ``config`` (a mapping or the run's config dataclass) is recorded as the run's parameters."""
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    out: list[Tracker] = []
    seen = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        if name == "console":
            out.append(ConsoleTracker(printer, console_width))
        elif name == "jsonl":
            out.append(JsonlTracker(run_dir))
        elif name == "tensorboard":
            out.append(TensorboardTracker(run_dir))
        elif name == "wandb":
            out.append(WandbTracker(run_dir, project_name, experiment_name, config))
        elif name == "mlflow":
            out.append(MlflowTracker(run_dir, project_name, experiment_name, config))
        else:
            raise ValueError(f"trainer.logger: {name!r} is not a tracker; use {', '.join(AVAILABLE)}")
    return out


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json``, or None when there is none or it does not parse."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def write_summary(
    run_dir: Path, before: Mapping[str, float], after: Mapping[str, float], **fields: Any
) -> dict[str, Any]:
    """``<run_dir>/summary.json``: ``fields`` (in order) and the validation before and after
    training (``val/acc`` and the ``val-core/`` metrics). Returns the summary."""
    summary = {
        "run_dir": str(run_dir),
        **fields,
        "val_acc_before": before.get("val/acc"),
        "val_acc_after": after.get("val/acc"),
        "val_before": {k: v for k, v in before.items() if k.startswith("val-core/")},
        "val_after": {k: v for k, v in after.items() if k.startswith("val-core/")},
    }
    write_text(
        Path(run_dir) / "summary.json",
        json.dumps(summary, indent=2),
        then=f"Then {RERUN}",
    )
    return summary
