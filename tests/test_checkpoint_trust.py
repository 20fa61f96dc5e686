"""Checkpoints as untrusted input: nothing in one runs code, corruption is caught (hashes, unlisted
files, step agreement), resume falls back past damage or stops, a full disk is one clear error."""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import subprocess
import uuid

import pytest
import torch

from dapo.checkpoint import space as checkpoint_space
from dapo.checkpoint.manifest import file_sha256
from dapo.checkpoint.store import (
    LATEST_FILE,
    MANIFEST,
    CheckpointError,
    DiskFullError,
    find_resume_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    save_model_dir,
)

torch.set_num_threads(1)


class _Payload:
    """Unpickling this writes ``marker``: the proof that a loader ran code from a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.fixture()
def make(tiny_random_model_dir):
    from transformers import AutoModelForCausalLM

    def make():
        model = AutoModelForCausalLM.from_pretrained(tiny_random_model_dir)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        ids = torch.arange(3, 15).view(2, 6)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        return model, opt, sched

    return make


def _save(run, step, model, opt, sched, **kw):
    return save_checkpoint(
        run, step, model=model, optimizer=opt, scheduler=sched, trainer_state={"k": step}, **kw
    )


def _rehash(ckpt, rel):
    """What an attacker (or a careless edit) does: make the manifest agree with a changed file."""
    m = json.loads((ckpt / MANIFEST).read_text())
    f = ckpt / rel
    m["files"][rel] = {"size": f.stat().st_size, "sha256": file_sha256(f)}
    (ckpt / MANIFEST).write_text(json.dumps(m))


def _flip(f, offset):
    data = bytearray(f.read_bytes())
    data[offset] ^= 0x01
    f.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------ no code


def test_pickle_in_dcp_metadata_never_runs(tmp_path, make):
    model, opt, sched = make()
    good = _save(tmp_path, 1, model, opt, sched)
    ckpt = _save(tmp_path, 2, model, opt, sched)
    marker = tmp_path / "marker"
    dcp_dir = ckpt / "actor" / "dcp"
    dcp_dir.mkdir()
    (dcp_dir / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    # dropped in: not in the manifest, so the checkpoint is refused before anything is read
    with pytest.raises(CheckpointError, match=r"actor/dcp/\.metadata: not listed in dapo_checkpoint.json"):
        load_checkpoint(ckpt, model, opt, sched)
    with pytest.warns(UserWarning, match=r"skipping checkpoint global_step_2: .*\.metadata: not listed"):
        assert find_resume_checkpoint(tmp_path, "auto") == good
    # listed with a matching hash (whoever writes a checkpoint can write its manifest): still no code
    _rehash(ckpt, "actor/dcp/.metadata")
    with pytest.raises(CheckpointError, match=r"\.metadata: not DCP metadata dapo can read safely"):
        load_checkpoint(ckpt, model, opt, sched)
    from dapo.distributed.fsdp_worker import load_sharded

    with pytest.raises(CheckpointError, match=r"\.metadata: not DCP metadata"):
        load_sharded(model, opt, str(dcp_dir))
    assert not marker.exists()


def test_pickle_in_a_dcp_item_never_runs(tmp_path, make):
    """DCP keeps non-tensor optimizer entries as pickled items; one of them carries the payload."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from dapo.distributed.fsdp_worker import load_sharded, save_sharded

    model, opt, _ = make()
    marker = tmp_path / "marker"
    clean = tmp_path / "clean"
    save_sharded(model, opt, str(clean))
    msd, osd = get_state_dict(model, opt)
    osd["param_groups"][0]["lr"] = _Payload(marker)
    evil = tmp_path / "evil"
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(evil))
    model2, opt2, _ = make()
    with pytest.raises(CheckpointError, match=r"item optim\.param_groups\.0\.lr is not plain data"):
        load_sharded(model2, opt2, str(evil))
    assert not marker.exists()
    # the real thing still loads through the restricted reader, bitwise
    model3, opt3, _ = make()
    with torch.no_grad():
        for p in model3.parameters():
            p.add_(1.0)
    load_sharded(model3, opt3, str(clean))
    for (k, a), b in zip(model.state_dict().items(), model3.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    s1, s3 = opt.state_dict()["state"], opt3.state_dict()["state"]
    assert all(torch.equal(s1[i]["exp_avg_sq"], s3[i]["exp_avg_sq"]) for i in s1)


# ------------------------------------------------------------------------------------ corruption


@pytest.mark.parametrize(
    "rel, offset",
    [
        ("actor/huggingface/model.safetensors", -3),  # a byte of the last tensor's data
        ("actor/optimizer.pt", -1000),
        ("trainer_state.json", None),  # the step digit
    ],
)
def test_a_flipped_byte_is_caught_and_resume_falls_back(tmp_path, make, rel, offset):
    model, opt, sched = make()
    good = _save(tmp_path, 2, model, opt, sched)
    bad = _save(tmp_path, 3, model, opt, sched)
    f = bad / rel
    size = f.stat().st_size
    if offset is None:
        text = f.read_text()
        assert '"global_step": 3' in text
        f.write_text(text.replace('"global_step": 3', '"global_step": 2'))
    else:
        _flip(f, offset)
    assert f.stat().st_size == size
    with pytest.raises(CheckpointError, match=f"{rel}: sha256 differs from dapo_checkpoint.json"):
        load_checkpoint(bad, *make())
    with pytest.warns(UserWarning, match=f"skipping checkpoint global_step_3: .*{rel}: sha256 differs"):
        assert find_resume_checkpoint(tmp_path, "auto") == good
    with pytest.raises(CheckpointError, match=f"trainer.resume_from_path: .*{rel}: sha256"):
        find_resume_checkpoint(tmp_path, "resume_path", str(bad))


def test_steps_must_agree_and_unreadable_files_are_one_line(tmp_path, make):
    model, opt, sched = make()
    ckpt = _save(tmp_path, 3, model, opt, sched)
    state = ckpt / "trainer_state.json"
    state.write_text(state.read_text().replace('"global_step": 3', '"global_step": 4'))
    _rehash(ckpt, "trainer_state.json")
    with pytest.raises(CheckpointError, match="trainer_state.json: global_step is 4, the manifest says 3"):
        load_checkpoint(ckpt, model, opt, sched)
    state.write_text('{"global_step": 3, "k": ')  # cut off
    _rehash(ckpt, "trainer_state.json")
    with pytest.raises(CheckpointError, match=r"trainer_state.json: unreadable \(JSONDecodeError") as e:
        load_checkpoint(ckpt, model, opt, sched)
    assert "\n" not in str(e.value)
    # a directory renamed to another step
    moved = ckpt.rename(tmp_path / "global_step_7")
    with pytest.raises(CheckpointError, match="dapo_checkpoint.json: says step 3, the directory is step 7"):
        load_checkpoint(moved, model, opt, sched)
    # garbage weights with a matching manifest: a CheckpointError naming the file, not a SafetensorError
    ckpt = _save(tmp_path, 5, model, opt, sched)
    weights = ckpt / "actor" / "huggingface" / "model.safetensors"
    weights.write_bytes(b"\xff" * 64)
    _rehash(ckpt, "actor/huggingface/model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"model.safetensors: unreadable or does not fit \(SafetensorError"
    ):
        load_checkpoint(ckpt, model, opt, sched)
    (ckpt / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"dapo_checkpoint.json: unreadable \(JSONDecodeError"):
        load_checkpoint(ckpt, model, opt, sched)


def test_unlisted_files_and_links_are_refused(tmp_path, make):
    model, opt, sched = make()
    ckpt = _save(tmp_path, 1, model, opt, sched)
    extra = ckpt / "actor" / "huggingface" / "extra.bin"
    extra.write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"huggingface/extra.bin: not listed in dapo_checkpoint.json"):
        load_checkpoint(ckpt, model, opt, sched)
    extra.unlink()
    (ckpt / "actor" / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(CheckpointError, match="actor/elsewhere: not a regular file"):
        load_checkpoint(ckpt, model, opt, sched)
    (ckpt / "actor" / "elsewhere").unlink()
    m = json.loads((ckpt / MANIFEST).read_text())
    m["files"]["../outside"] = {"size": 1, "sha256": "0" * 64}
    (ckpt / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(
        CheckpointError, match="lists '../outside', which is not a file inside the checkpoint"
    ):
        load_checkpoint(ckpt, model, opt, sched)


def test_none_usable_stops_and_an_earlier_format_loads_unverified(tmp_path, make):
    model, opt, sched = make()
    for step in (1, 2):
        _save(tmp_path, step, model, opt, sched)
    for step in (1, 2):
        _flip(tmp_path / f"global_step_{step}" / "rng_state.pt", -1)
    with pytest.warns(UserWarning) as record:
        with pytest.raises(
            CheckpointError, match=r"no usable checkpoint in .*rng_state.pt: sha256 .*1 older"
        ):
            find_resume_checkpoint(tmp_path, "auto")
    assert [str(w.message).split(":")[0] for w in record] == [
        "skipping checkpoint global_step_2",
        "skipping checkpoint global_step_1",
    ]
    # the latest file names a step whose directory is gone, and no other is left: stop too
    run = tmp_path / "gone"
    run.mkdir()
    (run / LATEST_FILE).write_text("4\n")
    with pytest.raises(CheckpointError, match="names step 4, but .* holds no global_step_N checkpoint"):
        find_resume_checkpoint(run, "auto")
    # format 1 (sizes, no hashes): loads, with a warning that it is unverified
    old = _save(tmp_path, 3, model, opt, sched)
    m = json.loads((old / MANIFEST).read_text())
    m = {"format": 1, "step": 3, "files": {k: v["size"] for k, v in m["files"].items()}}
    (old / MANIFEST).write_text(json.dumps(m))
    with pytest.warns(UserWarning, match="manifest format 1.*not verified"):
        assert load_checkpoint(old, model, opt, sched)["k"] == 3


# ------------------------------------------------------------------------------------ disk space


def _fake_disk(monkeypatch, capacity):
    """free_bytes of a disk of ``capacity`` bytes holding only the run directory."""

    def free(path):
        used = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return max(0, capacity - used)

    monkeypatch.setattr(checkpoint_space, "free_bytes", free)


def test_short_space_prunes_first_then_says_what_helps(tmp_path, make, monkeypatch):
    model, opt, sched = make()
    size = sum(f.stat().st_size for f in _save(tmp_path, 1, model, opt, sched).rglob("*") if f.is_file())
    for step in (2, 3):
        _save(tmp_path, step, model, opt, sched)
    # room for 3.5 checkpoints: the fourth fits only once the oldest two are pruned (keep 2)
    _fake_disk(monkeypatch, int(3.5 * size) + (1 << 20))
    pruned = []
    _save(tmp_path, 4, model, opt, sched, max_to_keep=2, log=pruned.append)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert [p.split()[1].rsplit("/", 1)[1] for p in pruned] == ["global_step_1", "global_step_2"]
    # no key to prune by: one message with the path, both byte counts and the keys; nothing written
    _fake_disk(monkeypatch, int(2.5 * size))
    with pytest.raises(DiskFullError) as e:
        _save(tmp_path, 5, model, opt, sched)
    msg = str(e.value)
    assert f"{tmp_path / 'global_step_5'}:" in msg and "\n" not in msg
    needed, free = (int(x.replace(",", "")) for x in re.findall(r"([\d,]+) bytes", msg))
    assert needed > free and abs(needed - size) <= (1 << 20) + 1024
    for key in ("trainer.max_actor_ckpt_to_keep", "trainer.save_freq", "trainer.default_local_dir"):
        assert key in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", "global_step_4", LATEST_FILE]
    # max_to_keep=1 never prunes the last complete one: 4 stays, and 5 does not fit next to it
    _fake_disk(monkeypatch, int(1.5 * size))
    with pytest.raises(DiskFullError, match=r"trainer.max_actor_ckpt_to_keep \(now 1\) lower"):
        _save(tmp_path, 5, model, opt, sched, max_to_keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4]


@pytest.fixture()
def small_tmpfs(tmp_path):
    """A 3 MiB tmpfs mount (root only); skips where mounting is not permitted."""
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the fake-disk test covers the logic")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs not permitted here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        gc.collect()  # safetensors maps the files it reads
        subprocess.run(["umount", "--lazy", str(mnt)], check=True)


def test_a_real_full_disk(small_tmpfs, make, monkeypatch):
    model, opt, sched = make()
    run = small_tmpfs / "run"
    saved = []
    with pytest.raises(DiskFullError, match=f"not enough disk space to save {run}/global_step_"):
        for step in range(1, 50):
            saved.append(_save(run, step, model, opt, sched))
    assert saved, "the tmpfs must hold at least one checkpoint"
    # the up-front check refused: the latest complete checkpoint is whole, nothing else was left
    assert sorted(p.name for p in run.iterdir()) == sorted([p.name for p in saved] + [LATEST_FILE])
    assert load_checkpoint(saved[-1], *make())["k"] == len(saved)
    # an estimate that is far too low, and room for about half a checkpoint: the disk fills up
    # mid-write, same message, no debris
    monkeypatch.setattr(checkpoint_space, "estimate_bytes", lambda *a, **k: 0)
    size = sum(f.stat().st_size for f in saved[-1].rglob("*") if f.is_file())
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"\0" * max(0, checkpoint_space.free_bytes(run) - size // 2))
    with pytest.raises(DiskFullError, match="not enough disk space") as e:
        _save(run, 99, model, opt, sched)
    assert isinstance(e.value.__cause__, Exception)
    assert sorted(p.name for p in run.iterdir()) == sorted([p.name for p in saved] + [LATEST_FILE])
    # the final model directory is written the same way
    (small_tmpfs / "filler2").write_bytes(b"\0" * max(0, checkpoint_space.free_bytes(run) - 8192))
    with pytest.raises(DiskFullError, match=f"not enough disk space to save {run / 'final_model'}: "):
        save_model_dir(run / "final_model", model)
    assert sorted(p.name for p in run.iterdir()) == sorted([p.name for p in saved] + [LATEST_FILE])


def test_a_run_on_a_full_disk_stops_with_one_line(
    tmp_path, tiny_random_model_dir, mod3_task, monkeypatch, capsys
):
    from dapo.cli import main
    from runs import small_run_args

    run = tmp_path / "run"
    monkeypatch.setattr(checkpoint_space, "free_bytes", lambda path: 123_456)
    assert main(small_run_args(run, tiny_random_model_dir, mod3_task, 1, "trainer.save_freq=1")) == 2
    (err,) = [x for x in capsys.readouterr().err.splitlines() if "dapo:" in x or "Traceback" in x]
    assert err.startswith(f"dapo: not enough disk space to save {run / 'global_step_1'}: it needs about ")
    assert "123,456 bytes (0.1 MiB) are free there" in err and "trainer.max_actor_ckpt_to_keep" in err
    assert not [p for p in run.iterdir() if "global_step_" in p.name]


@pytest.mark.parametrize(
    "doc",
    [
        '{"format": 2, "step": 1e999, "files": {}}',  # a step that is not an integer (inf)
        '{"format": 2, "step": 1, "files": {"rng_state.pt": {"size": 1e999, "sha256": "' + "0" * 64 + '"}}}',
        "[" * 100_000 + "]" * 100_000,  # nested past the JSON parser's recursion limit
        '{"format": 2, "step": 1.5, "files": {}}',
        '{"format": 2, "step": 1, "files": {"rng_state.pt": {"size": -3, "sha256": "' + "0" * 64 + '"}}}',
    ],
    ids=["infinite-step", "infinite-size", "deep-nesting", "float-step", "negative-size"],
)
def test_a_crafted_manifest_is_one_checkpoint_error(tmp_path, make, doc):
    """Whatever a shared manifest holds, listing, saving beside it and resuming past it work: the
    bad checkpoint is skipped with a line naming its manifest, never a raw traceback."""
    model, opt, sched = make()
    run = tmp_path / "run"
    _save(run, 1, model, opt, sched)
    bad = run / "global_step_1"
    (bad / MANIFEST).write_text(doc)
    warnings = []
    with pytest.raises(CheckpointError, match=re.escape(str(bad / MANIFEST))):
        find_resume_checkpoint(run, warn=warnings.append)
    assert list_checkpoints(run) == []
    _save(run, 2, model, opt, sched)  # saving next to it lists and prunes around it
    assert find_resume_checkpoint(run, warn=warnings.append) == run / "global_step_2"


def test_trainer_state_that_does_not_fit_is_skipped_for_the_one_before(
    tmp_path, tiny_random_model_dir, mod3_task, capsys
):
    """A checkpoint whose trainer_state.json parses and hashes right but does not fit the trainer
    (the sampler's position missing) is a damaged checkpoint: auto resume names the file and
    goes back to the previous one instead of ending in a KeyError traceback."""
    from dapo.cli import main
    from runs import small_run_args

    run = tmp_path / "run"
    assert main(small_run_args(run, tiny_random_model_dir, mod3_task, 2, "trainer.save_freq=1")) == 0
    bad = run / "global_step_2"
    st = json.loads((bad / "trainer_state.json").read_text())
    del st["sampler"]["position"]
    (bad / "trainer_state.json").write_text(json.dumps(st))
    _rehash(bad, "trainer_state.json")
    capsys.readouterr()
    assert main(small_run_args(run, tiny_random_model_dir, mod3_task, 3, "trainer.save_freq=1")) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    (warn,) = [x for x in text.splitlines() if "skipping checkpoint global_step_2" in x]
    assert f"{bad / 'trainer_state.json'}: " in warn and "position" in warn
    assert f"resumed from {run / 'global_step_1'} (step 1)" in text
    assert json.loads((run / "global_step_3" / "trainer_state.json").read_text())["global_step"] == 3
