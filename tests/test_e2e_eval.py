"""`dapo eval` on a run's final model prints the run's last validation numbers (same seed), and
`dapo eval --model M` scores M even in a run directory holding a checkpoint of other weights."""

from pathlib import Path

import pytest

from dapo.cli import main
from dapo.tasks.arithmetic import write_task
from runs import metric_rows

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_random_model_dir):
    """(run_dir, common eval args): two steps with validation before and after, a checkpoint at step 2."""
    tmp_path = tmp_path_factory.mktemp("eval")
    train, test = write_task(tmp_path / "data", train_size=24, test_size=12)
    common = [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "trainer.torch_threads=1",
        f"custom_reward_function.path={FIXTURES / 'parity_reward.py'}",
        "reward_model.scoring.mode=inline",
        "actor_rollout_ref.rollout.val_kwargs.n=4",
    ]
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "train",
                *common,
                f"actor_rollout_ref.model.path={tiny_random_model_dir}",
                f"trainer.default_local_dir={run_dir}",
                "trainer.total_training_steps=2",
                "trainer.save_freq=2",
                "trainer.logger=[jsonl]",
                "trainer.val_before_train=true",
                "data.train_batch_size=4",
                "data.gen_batch_size=4",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                "algorithm.filter_groups.enable=false",
                "actor_rollout_ref.actor.optim.lr=1e-2",
            ]
        )
        == 0
    )
    return run_dir, common


def _val_core(row):
    return {k: v for k, v in row.items() if k.startswith("val-core/")}


def _eval(capsys, model, run_dir, common):
    capsys.readouterr()
    assert main(["eval", "--model", str(model), *common, f"trainer.default_local_dir={run_dir}"]) == 0
    return dict(line.split(" = ") for line in capsys.readouterr().out.splitlines() if " = " in line)


def _assert_same(printed, core):
    assert core and set(core) <= set(printed)
    for k, v in core.items():
        assert float(printed[k]) == round(v, 6) or abs(float(printed[k]) - v) < 1e-6, k


def test_eval_reproduces_last_validation(trained, tmp_path, capsys):
    run_dir, common = trained
    last = metric_rows(run_dir)[-1]
    printed = _eval(capsys, run_dir / "final_model", tmp_path / "eval", common)
    _assert_same(printed, _val_core(last))


def test_eval_never_loads_a_checkpoint_over_the_model(trained, tiny_random_model_dir, capsys):
    run_dir, common = trained
    rows = metric_rows(run_dir)
    before = _val_core(next(r for r in rows if r["step"] == 0))  # the untrained model's numbers
    after = _val_core(rows[-1])
    assert (run_dir / "global_step_2").is_dir() and before != after, "the checkpoint must score differently"
    # evaluated in the run directory, beside the step-2 checkpoint: the given model's numbers
    printed = _eval(capsys, tiny_random_model_dir, run_dir, common)
    _assert_same(printed, before)
    # a checkpoint given as the model is checked first: a damaged one is one line, not a score
    weights = run_dir / "global_step_2" / "actor" / "huggingface" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x10
    weights.write_bytes(bytes(data))
    assert main(["eval", "--model", str(run_dir / "global_step_2"), *common]) == 2
    (err,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dapo:")]
    assert err == f"dapo: {weights}: sha256 differs from dapo_checkpoint.json (the file is corrupted)"
    # removing the manifest does not skip the check: a global_step_N without one was cut off
    (run_dir / "global_step_2" / "dapo_checkpoint.json").unlink()
    assert main(["eval", "--model", str(run_dir / "global_step_2"), *common]) == 2
    (err,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dapo:")]
    assert err.startswith(f"dapo: {run_dir / 'global_step_2' / 'dapo_checkpoint.json'}: missing")


@pytest.mark.parametrize("given", ["missing", "not_a_model"])
def test_eval_of_what_is_not_a_model_is_one_line_and_leaves_no_directory(
    given, tmp_path, monkeypatch, capsys
):
    """`dapo eval --model X` names X as given (not X/actor/huggingface) and, refused, writes no run
    directory under the current one."""
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "nope"
    if given == "not_a_model":
        model.mkdir()
        (model / "notes.txt").write_text("not a model")
    assert main(["eval", "--model", str(model)]) == 2
    err = capsys.readouterr().err
    want = "does not exist" if given == "missing" else "is not a model directory"
    assert err.strip().splitlines() == [
        f"dapo: --model {model}: {want} (a directory with config.json, or a global_step_N checkpoint "
        "holding one); give the model directory or checkpoint to score"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if given == "missing" else ["nope"])
