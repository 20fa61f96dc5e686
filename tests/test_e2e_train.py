"""`dapo train` end to end on a user's own parquet and model directory (tiny random model)."""

import os
import warnings

import pytest
import torch

from dapo.cli import main
from dapo.tasks.arithmetic import write_task
from runs import jsonl_rows, metric_rows, run_summary, tool_run_args, train_args


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("data"), train_size=64, test_size=16)


def _train(tmp_path, model_dir, train, test, *extra):
    run_dir = tmp_path / "run"
    rc = main(train_args(run_dir, model_dir, train, test, 2, *extra))
    return rc, run_dir


def test_train_on_user_parquet_and_model_dir(tmp_path, tiny_random_model_dir, user_data):
    train, test = user_data
    # a random model never gets a group with spread, so filtering is off to exercise the update
    rc, run_dir = _train(tmp_path, tiny_random_model_dir, train, test, "algorithm.filter_groups.enable=false")
    assert rc == 0
    rows = metric_rows(run_dir)
    steps = [r["step"] for r in rows]
    assert steps == [0, 1, 2]
    for key in (
        "train/num_gen_batches",
        "critic/score/mean",
        "response_length/mean",
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/entropy",
        "timing_s/gen",
        "timing_s/step",
        "actor/grad_norm",
    ):
        assert key in rows[1], key
    # the step's CPU seconds: positive, and no more than every core running through the step
    # (a unit slip, ms for s, would break it)
    for r in rows[1:]:
        assert 0 < r["perf/cpu_time_per_step"] <= (r["timing_s/step"] + 1.0) * os.cpu_count()
    assert "val-core/arithmetic/acc/mean@2" in rows[0] and "val-core/arithmetic/acc/mean@2" in rows[2]
    summary = run_summary(run_dir)
    assert summary["steps"] == 2
    # the validations before and after training are the ones logged at steps 0 and 2
    assert (summary["val_acc_before"], summary["val_acc_after"]) == (rows[0]["val/acc"], rows[2]["val/acc"])
    assert summary["val_after"] == {k: v for k, v in rows[2].items() if k.startswith("val-core/")}

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final_model")
    assert AutoTokenizer.from_pretrained(run_dir / "final_model").chat_template
    # the saved model is the trained one: same shapes as the model it started from, other weights
    start = dict(AutoModelForCausalLM.from_pretrained(tiny_random_model_dir).named_parameters())
    trained = dict(model.named_parameters())
    assert {k: p.shape for k, p in trained.items()} == {k: p.shape for k, p in start.items()}
    assert any(not torch.equal(p, start[k]) for k, p in trained.items())


def test_dynamic_sampling_exhaustion_is_logged_not_fatal(
    tmp_path, tiny_random_model_dir, user_data, capsys, caplog
):
    train, test = user_data
    rc, run_dir = _train(
        tmp_path,
        tiny_random_model_dir,
        train,
        test,
        "algorithm.filter_groups.max_num_gen_batches=2",
        "trainer.val_before_train=false",
    )
    # every step ran; a random model never fills a group with spread, so none made an update,
    # and the run says so and fails rather than ending "done"
    rows = metric_rows(run_dir)
    assert rows[0]["train/num_gen_batches"] == 2 and [r["step"] for r in rows] == [1, 2]
    out = capsys.readouterr().out
    assert "no update" in out
    assert rc == 1 and "nothing was trained" in out
    assert "algorithm.filter_groups.max_num_gen_batches=2 reached" in caplog.text


def test_missing_data_file_stops_before_training(tmp_path, tiny_random_model_dir, capsys):
    rc = main(
        [
            "train",
            f"data.train_files={tmp_path}/missing.parquet",
            f"actor_rollout_ref.model.path={tiny_random_model_dir}",
            f"trainer.default_local_dir={tmp_path}/run",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "missing.parquet does not exist" in err and "data.train_files" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_bad_model_dir_is_named(tmp_path, capsys):
    rc = main(
        [
            "train",
            f"actor_rollout_ref.model.path={tmp_path}/nomodel",
            f"trainer.default_local_dir={tmp_path}/run",
        ]
    )
    assert rc == 2
    assert "actor_rollout_ref.model.path" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["process", "ray"])
def test_two_worker_run_checkpoints_and_resumes_in_process(
    tmp_path, tiny_random_model_dir, user_data, backend
):
    """`dapo train` with 2 actor ranks (spawned processes or local Ray), then resumed on 1 rank."""
    if backend == "ray":
        pytest.importorskip(
            "ray", reason="the Ray backend needs the 'scale' extra (pip install 'dapo[scale]')"
        )
    train, test = user_data
    common = [
        "algorithm.filter_groups.enable=false",
        "trainer.val_before_train=false",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, run_dir = _train(
            tmp_path,
            tiny_random_model_dir,
            train,
            test,
            *common,
            "trainer.n_gpus_per_node=2",
            f"trainer.worker_backend={backend}",
            "trainer.save_freq=2",
        )
    assert rc == 0
    # the driver's optimizer never steps (the ranks step theirs): no warning about the schedule
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]
    assert (run_dir / "global_step_2" / "actor" / "dcp").is_dir()
    rows = metric_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2] and "actor/pg_loss" in rows[0]
    # the sharded checkpoint resumes at world size 1 and trains on
    rc = main(
        [
            "train",
            f"data.train_files={train}",
            f"data.val_files={test}",
            f"actor_rollout_ref.model.path={tiny_random_model_dir}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.total_training_steps=3",
            "trainer.torch_threads=1",
            "data.train_batch_size=4",
            "data.gen_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.val_kwargs.n=2",
            *common,
        ]
    )
    assert rc == 0
    rows = metric_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_multi_turn_tool_run_logs_turns_and_dumps_messages(tmp_path, tiny_random_model_dir):
    """The tools preset's loop runs inside `dapo train`: turn metrics and per-turn dumps."""
    run_dir = tmp_path / "run"
    rc = main(
        tool_run_args(
            run_dir,
            tiny_random_model_dir,
            1,
            "trainer.logger=[jsonl]",
            "data.max_response_length=48",
            f"trainer.rollout_data_dir={run_dir}/dumps",
        )
    )
    assert rc == 0
    row = metric_rows(run_dir)[0]
    for key in ("num_turns/mean", "tool_call_counts/mean", "tools/call_rate", "val-aux/num_turns/mean"):
        assert key in row, key
    dumped = jsonl_rows(run_dir / "dumps" / "1.jsonl")[0]
    assert dumped["messages"][0]["role"] == "assistant" and "num_turns" in dumped
