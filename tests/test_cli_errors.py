"""Every DapoError ends a `dapo` command with its `dapo:` message on stderr and exit status 2, no
traceback; any other exception keeps its traceback."""

from __future__ import annotations

import pytest

from dapo.checkpoint.manifest import CheckpointError
from dapo.cli import main
from dapo.config.load import ConfigError
from dapo.data.parquet import DataError
from dapo.errors import DapoError, ModelError, TrainingError
from dapo.outputs.rundir import RunDirError
from dapo.outputs.tracking import TrackerUnavailable
from dapo.viewer.dump_reader import DumpError


def test_errors_share_the_base_and_keep_their_builtin():
    from dapo.data.preprocess import PreprocessError
    from dapo.model.gguf import GGUFError
    from dapo.reward.scorers import UnknownDataSourceError
    from dapo.rollout.vllm_rollout import WeightSyncError
    from dapo.sampling import GenerationBudgetExhausted
    from dapo.tools.config import ToolConfigError
    from dapo.viewer.report import ReportError

    builtin = {
        ConfigError: ValueError,
        DataError: ValueError,
        ModelError: ValueError,
        GGUFError: ValueError,
        PreprocessError: ValueError,
        DumpError: ValueError,
        ReportError: ValueError,
        ToolConfigError: ValueError,
        GenerationBudgetExhausted: ValueError,
        CheckpointError: RuntimeError,
        RunDirError: RuntimeError,
        TrainingError: RuntimeError,
        WeightSyncError: RuntimeError,
        TrackerUnavailable: ImportError,
        UnknownDataSourceError: NotImplementedError,
    }
    for cls, base in builtin.items():
        assert issubclass(cls, DapoError) and issubclass(cls, base), cls


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_unknown_config_key(capsys):
    rc, err = _run(["validate", "data.trian_batch_size=3"], capsys)
    assert rc == 2
    assert err == (
        "dapo: invalid configuration: data.trian_batch_size: unknown configuration key; did you mean data.train_batch_size or "
        "data.val_batch_size or data.gen_batch_size?\n"
    )


def test_config_rule_violation(capsys):
    rc, err = _run(["validate", "data.gen_batch_size=8", "data.train_batch_size=16"], capsys)
    assert rc == 2
    assert err == (
        "dapo: invalid configuration: data.gen_batch_size=8 is smaller than data.train_batch_size=16: a generation round must "
        "cover at least one training batch; set data.gen_batch_size>=16 (or null for 16)\n"
    )


def test_cut_off_checkpoint(tmp_path, capsys):
    ckpt = tmp_path / "run" / "global_step_3"
    ckpt.mkdir(parents=True)
    rc, err = _run(["eval", "--model", str(ckpt)], capsys)
    assert rc == 2
    assert err == (
        f"dapo: {ckpt / 'dapo_checkpoint.json'}: missing (the checkpoint was cut off mid-write or copied in part)\n"
    )


def test_missing_data_file(tmp_path, tiny_random_model_dir, capsys):
    missing = tmp_path / "missing.parquet"
    argv = ["train", f"data.train_files={missing}", f"actor_rollout_ref.model.path={tiny_random_model_dir}"]
    rc, err = _run([*argv, f"trainer.default_local_dir={tmp_path}/run"], capsys)
    assert rc == 2
    assert err.splitlines()[-1] == (
        f"dapo: data file {missing} does not exist: point data.train_files / data.val_files at a verl parquet file"
    )
    assert "Traceback" not in err


def test_unexpected_exception_keeps_its_traceback(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(OSError):
        main(["data", "arithmetic", "--output", str(not_a_dir / "data")])


def test_data_arithmetic_into_an_existing_file_is_one_line(tmp_path, capsys):
    taken = tmp_path / "good.parquet"
    taken.write_bytes(b"the user's")
    rc, err = _run(["data", "arithmetic", "--output", str(taken)], capsys)
    assert rc == 2 and err.strip() == (
        f"dapo: --output {taken}: is a file; give a directory (train.parquet and test.parquet are "
        "written into it)"
    )
    assert taken.read_bytes() == b"the user's"


def test_several_config_problems_are_listed_one_per_line(capsys):
    argv = ["validate", "data.trian_batch_size=3", "data.gen_batch_size=8", "data.train_batch_size=16"]
    rc, err = _run(argv, capsys)
    assert rc == 2
    head, *problems = err.splitlines()
    assert head == "dapo: invalid configuration:"
    assert [p.split(":")[0] for p in problems] == [
        "  - data.trian_batch_size",
        "  - data.gen_batch_size=8 is smaller than data.train_batch_size=16",
    ]


@pytest.mark.parametrize(
    "case", ["no_weights", "config_not_json", "cuda_on_cpu", "run_dir_is_a_file", "lock_is_a_dir"]
)
def test_a_users_mistake_in_train_is_one_dapo_line(case, tmp_path, tiny_random_model_dir, capsys):
    """Mistakes the trainer meets after validate (which cannot see them all): each is one `dapo:`
    line that names the key and the path, exit 2, no traceback, instead of transformers', torch's
    or the OS's exception."""
    import shutil

    import torch

    if case == "cuda_on_cpu" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model = tmp_path / "model"
    shutil.copytree(tiny_random_model_dir, model)
    run = tmp_path / "run"
    if case == "no_weights":
        for f in model.glob("*.safetensors"):
            f.unlink()
    elif case == "config_not_json":
        (model / "config.json").write_text("not json")
    elif case == "run_dir_is_a_file":
        run.write_text("a file of the user's")
    elif case == "lock_is_a_dir":
        (run / "dapo.lock").mkdir(parents=True)
    args = ["train", f"actor_rollout_ref.model.path={model}", f"trainer.default_local_dir={run}"]
    if case == "cuda_on_cpu":
        args.append("trainer.device=cuda")
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("dapo:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    says = {
        "no_weights": f"actor_rollout_ref.model.path: the model in {model} does not load",
        "config_not_json": "does not load",
        "cuda_on_cpu": "trainer.device=cuda: this machine has no CUDA device",
        "run_dir_is_a_file": f"trainer.default_local_dir={run}: cannot take the run directory's lock",
        "lock_is_a_dir": f"trainer.default_local_dir={run}: cannot take the run directory's lock",
    }[case]
    assert says in lines[0], lines[0]
    if case == "run_dir_is_a_file":
        assert run.read_text() == "a file of the user's"
