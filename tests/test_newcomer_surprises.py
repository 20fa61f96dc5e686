"""What a first run used to do silently: train nothing on data smaller than a batch and end
`done`, run final validation under test_freq=-1 without a word, print the built-in train set's
size in `dapo eval`, grade MATH answers without a box unannounced; and where a run's files land
(the resolved config, the cache)."""

from __future__ import annotations

from omegaconf import OmegaConf

from dapo.cli import main
from dapo.config.load import load_config
from dapo.data.parquet import read_rows, write_rows
from dapo.tasks.arithmetic import write_task
from runs import run_summary, train_args


def test_data_smaller_than_a_batch_warns_first_and_a_run_without_updates_fails(
    tmp_path, tiny_random_model_dir, capsys
):
    train, test = write_task(tmp_path / "data", train_size=6, test_size=2)
    run_dir = tmp_path / "run"
    args = train_args(run_dir, tiny_random_model_dir, train, test, 2, "trainer.logger=[console,jsonl]")
    # a random model never answers right: every group is all-wrong and filtered
    args += [
        "data.train_batch_size=8",
        "data.gen_batch_size=8",
        "algorithm.filter_groups.max_num_gen_batches=1",
    ]
    args += ["trainer.test_freq=-1"]
    rc = main(args)
    out = capsys.readouterr().out
    assert rc == 1, out
    lines = out.splitlines()
    n_train = len(read_rows(train))
    assert n_train < 8
    warn = next(i for i, x in enumerate(lines) if x.startswith(f"warning: {n_train} train prompts"))
    assert "fewer than one batch (data.train_batch_size=8)" in lines[warn]
    assert warn < next(i for i, x in enumerate(lines) if x.startswith("run directory:"))
    assert "nothing was trained" in out and "done" not in out
    summary = run_summary(run_dir)
    assert summary["steps"] == 2 and summary["steps_run"] == 2 and summary["updates"] == 0
    # test_freq=-1: the console says validation still runs after the last step
    note = [x for x in lines if x.startswith("note: trainer.test_freq=-1")]
    assert len(note) == 1 and "after the last step" in note[0]
    assert summary["val_acc_after"] is not None
    # the run directory holds the resolved configuration
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.data.train_batch_size == 8 and saved.trainer.default_local_dir == str(run_dir)


def test_eval_counts_validation_prompts_only_and_names_the_math_grading(
    tmp_path, tiny_random_model_dir, capsys
):
    _, test = write_task(tmp_path / "data", train_size=4, test_size=3)
    rows = [{**r, "data_source": "lighteval/MATH"} for r in read_rows(test)]
    math_test = tmp_path / "math_test.parquet"
    write_rows(math_test, rows)
    rc = main(
        [
            "eval",
            "--model",
            str(tiny_random_model_dir),
            f"data.val_files={math_test}",
            f"trainer.default_local_dir={tmp_path / 'eval'}",
            "trainer.torch_threads=1",
            "actor_rollout_ref.rollout.val_kwargs.n=1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert f"data: {len(rows)} validation prompts" in out and "train prompts" not in out
    notes = [x for x in out.splitlines() if "lighteval/MATH" in x and x.startswith("note:")]
    assert len(notes) == 1 and "Answer: X" in notes[0] and "\\boxed{}" in notes[0]


def test_every_preset_path_follows_dapo_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    cfg = load_config([], preset="smollm2")
    for path in (cfg.data.train_files, cfg.data.val_files, cfg.actor_rollout_ref.model.path):
        assert str(path).startswith(str(tmp_path / "cache") + "/"), path
    assert cfg.trainer.report_freq > 0
    monkeypatch.delenv("DAPO_CACHE")
    assert load_config([], preset="smollm2").data.train_files.startswith("~/.cache/dapo/")
