"""checkpoint.py: atomic layout, bitwise round trip of weights/optimizer/scheduler/RNG/generators,
completeness checks, resume modes, pruning (verification, fallback and disk space:
test_checkpoint_trust.py)."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch

from dapo.checkpoint.store import (
    LATEST_FILE,
    MANIFEST,
    CheckpointError,
    find_resume_checkpoint,
    hf_model_dir,
    is_complete,
    list_checkpoints,
    load_checkpoint,
    read_latest,
    save_checkpoint,
)

torch.set_num_threads(1)


@pytest.fixture()
def setup(tiny_random_model_dir, char_tokenizer):
    from transformers import AutoModelForCausalLM

    def make():
        model = AutoModelForCausalLM.from_pretrained(tiny_random_model_dir)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        return model, opt, sched

    return make, char_tokenizer


def _train_step(model, opt, sched, gen):
    ids = torch.randint(3, 20, (2, 6), generator=gen)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    return float(loss.detach())


def _draws(gen):
    return (
        random.random(),
        float(np.random.rand()),
        float(torch.rand(1)),
        float(torch.rand(1, generator=gen)),
    )


def test_round_trip_is_bitwise_and_continues_identically(tmp_path, setup):
    make, tok = setup
    model, opt, sched = make()
    gen = torch.Generator().manual_seed(3)
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    for _ in range(2):
        _train_step(model, opt, sched, gen)
    state = {
        "sampler": {"epoch": 0, "position": 5},
        "kl": 0.001,
        "np_int": np.int64(4),
        "gens": {"rollout": gen},
    }
    path = save_checkpoint(
        tmp_path, 2, model=model, tokenizer=tok, optimizer=opt, scheduler=sched, trainer_state=state
    )
    assert path == tmp_path / "global_step_2" and is_complete(path)
    assert read_latest(tmp_path) == 2 and (tmp_path / LATEST_FILE).read_text() == "2\n"
    # the straight continuation
    expected_draws = _draws(gen)
    expected_loss = _train_step(model, opt, sched, gen)
    expected_w = {k: v.clone() for k, v in model.state_dict().items()}

    # a fresh process-like restart: new objects, scrambled RNGs
    model2, opt2, sched2 = make()
    gen2 = torch.Generator().manual_seed(999)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    got = load_checkpoint(path, model2, opt2, sched2, generators={"gens/rollout": gen2})
    assert got["global_step"] == 2 and got["sampler"] == {"epoch": 0, "position": 5}
    assert got["kl"] == 0.001 and got["np_int"] == 4
    assert isinstance(got["gens"]["rollout"], torch.Generator)
    assert torch.equal(got["gens"]["rollout"].get_state(), gen2.get_state())
    assert sched2.last_epoch == 2
    assert _draws(gen2) == expected_draws
    assert _train_step(model2, opt2, sched2, gen2) == expected_loss
    for k, v in model2.state_dict().items():
        assert torch.equal(v, expected_w[k]), k
    # the model directory loads anywhere with from_pretrained
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(hf_model_dir(path)) is not None
    assert AutoTokenizer.from_pretrained(hf_model_dir(path)) is not None


def test_non_jsonable_state_is_refused_and_leaves_nothing(tmp_path, setup):
    make, tok = setup
    model, opt, sched = make()
    with pytest.raises(TypeError, match="not JSON-able"):
        save_checkpoint(
            tmp_path, 1, model=model, optimizer=opt, scheduler=sched, trainer_state={"x": object()}
        )
    assert list(tmp_path.iterdir()) == []


def test_cut_off_directory_is_never_latest(tmp_path, setup):
    make, tok = setup
    model, opt, sched = make()
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model=model, optimizer=opt, scheduler=sched, trainer_state={})
    good = tmp_path / "global_step_2"
    # step 3: a copy cut off mid-write (no manifest), and latest pointing at it
    bad = tmp_path / "global_step_3"
    shutil.copytree(good, bad)
    (bad / MANIFEST).unlink()
    (tmp_path / LATEST_FILE).write_text("3\n")
    with pytest.warns(
        UserWarning, match="skipping checkpoint global_step_3: .*dapo_checkpoint.json: missing"
    ):
        assert find_resume_checkpoint(tmp_path, "auto") == good
    # step 4: manifest present but a file truncated
    bad4 = tmp_path / "global_step_4"
    shutil.copytree(good, bad4)
    m = json.loads((bad4 / MANIFEST).read_text())
    m["step"] = 4
    (bad4 / MANIFEST).write_text(json.dumps(m))
    opt_file = bad4 / "actor" / "optimizer.pt"
    opt_file.write_bytes(opt_file.read_bytes()[:100])
    (tmp_path / LATEST_FILE).write_text("4\n")
    with pytest.warns(UserWarning, match="global_step_4.*optimizer.pt: 100 bytes.*truncated"):
        assert find_resume_checkpoint(tmp_path, "auto") == good
    # a leftover temp dir of an interrupted save is not a checkpoint either
    shutil.copytree(good, tmp_path / ".global_step_5.tmp-123")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        load_checkpoint(bad4, model, opt, sched)
    with pytest.raises(
        CheckpointError, match="trainer.resume_from_path: .*global_step_3/dapo_checkpoint.json: missing"
    ):
        find_resume_checkpoint(tmp_path, "resume_path", str(bad))
    # the next save cleans the temp dir and replaces the cut-off step-3 directory
    save_checkpoint(tmp_path, 3, model=model, optimizer=opt, scheduler=sched, trainer_state={})
    assert not (tmp_path / ".global_step_5.tmp-123").exists()
    assert find_resume_checkpoint(tmp_path, "auto") == bad and is_complete(bad)


def test_resume_modes(tmp_path, setup):
    make, tok = setup
    model, opt, sched = make()
    assert find_resume_checkpoint(tmp_path, "auto") is None  # fresh start
    assert find_resume_checkpoint(tmp_path / "nope", "auto") is None
    save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=sched, trainer_state={})
    save_checkpoint(tmp_path, 2, model=model, optimizer=opt, scheduler=sched, trainer_state={})
    assert find_resume_checkpoint(tmp_path, "disable") is None
    assert find_resume_checkpoint(tmp_path, "auto") == tmp_path / "global_step_2"
    p1 = str(tmp_path / "global_step_1")
    assert find_resume_checkpoint(tmp_path, "resume_path", p1) == tmp_path / "global_step_1"
    with pytest.raises(CheckpointError, match="needs trainer.resume_from_path"):
        find_resume_checkpoint(tmp_path, "resume_path", None)
    with pytest.raises(CheckpointError, match="trainer.resume_mode='sometimes'"):
        find_resume_checkpoint(tmp_path, "sometimes")


def test_max_to_keep_prunes_oldest(tmp_path, setup):
    make, tok = setup
    model, opt, sched = make()
    for step in range(1, 5):
        save_checkpoint(
            tmp_path, step, model=model, optimizer=opt, scheduler=sched, trainer_state={}, max_to_keep=2
        )
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", "global_step_4", LATEST_FILE]
    save_checkpoint(
        tmp_path, 5, model=model, optimizer=opt, scheduler=sched, trainer_state={}, max_to_keep=None
    )
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4, 5]


def test_resave_same_step_replaces_atomically(tmp_path, setup):
    make, tok = setup
    model, opt, sched = make()
    save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=sched, trainer_state={"v": 1})
    save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=sched, trainer_state={"v": 2})
    assert json.loads((tmp_path / "global_step_1" / "trainer_state.json").read_text())["v"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", LATEST_FILE]
