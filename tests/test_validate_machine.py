"""`dapo validate` checks on this machine what it can without running: the data files exist and
are parquet with the prompt column (footer only), the model path is a model directory, and the
device asked for is here. One line per problem, naming the key and the path."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dapo.config.machine
from dapo.cli import main


def _validate(capsys, *args: str) -> tuple[int, list[str]]:
    rc = main(["validate", *args])
    err = capsys.readouterr().err
    return rc, [line.strip().removeprefix("- ") for line in err.splitlines()]


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has ``n`` CUDA devices."""

    def set_count(n: int) -> None:
        monkeypatch.setattr(dapo.config.machine, "cuda_device_count", lambda: n)

    return set_count


def _parquet(path, **columns):
    pq.write_table(pa.table(columns or {"prompt": ["q"] * 20}), path)
    return path


def _model(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (path / "model.safetensors").write_bytes(b"")  # validate looks for the file, never reads it
    return path


def test_every_file_and_device_problem_at_once(tmp_path, capsys, gpus):
    gpus(0)
    good = _parquet(tmp_path / "good.parquet")
    text = tmp_path / "notes.parquet"
    text.write_text("not a parquet file\n")
    rc, lines = _validate(
        capsys,
        f"data.train_files={tmp_path}/missing.parquet",
        f"data.val_files=[{good},{text},{tmp_path}]",
        f"actor_rollout_ref.model.path={tmp_path}/no_model",
        "trainer.device=cuda",
    )
    assert rc == 2
    problems = [line for line in lines if line.startswith(("data.", "actor_rollout_ref.", "trainer."))]
    assert problems == [
        f"data.train_files: {tmp_path}/missing.parquet does not exist; point the key at a verl parquet file "
        "(`dapo preprocess` converts jsonl, json and csv files)",
        problems[1],
        f"data.val_files: {tmp_path} is a directory; name the parquet file(s) in it (a list: [a.parquet,b.parquet])",
        f"actor_rollout_ref.model.path: {tmp_path}/no_model does not exist; point it at a Hugging Face model "
        "directory, or null for the built-in tiny model",
        "trainer.device=cuda: this machine has no CUDA device (torch.cuda.is_available() is false); set "
        "trainer.device=cpu, or validate on the machine that trains",
    ]
    assert problems[1].startswith(f"data.val_files: {text} is not a parquet file (")


def test_good_files_validate_and_only_the_footer_is_read(tmp_path, capsys, monkeypatch):
    data = _parquet(tmp_path / "train.parquet")
    model = _model(tmp_path / "model")

    def no_rows(*args, **kwargs):
        raise AssertionError("dapo validate read the rows of a data file")

    monkeypatch.setattr(pq, "read_table", no_rows)
    monkeypatch.setattr(pq.ParquetFile, "read", no_rows)
    rc, lines = _validate(
        capsys, f"data.train_files={data}", f"data.val_files={data}", f"actor_rollout_ref.model.path={model}"
    )
    assert rc == 0 and any("configuration OK" in line for line in lines)


def test_the_prompt_column_must_be_in_the_file(tmp_path, capsys):
    data = _parquet(tmp_path / "qa.parquet", question=["q"] * 20, answer=["a"] * 20)
    rc, lines = _validate(capsys, f"data.train_files={data}")
    assert rc == 2
    assert (
        f"data.train_files: {data} has no column 'prompt' (data.prompt_key; its columns: question, answer); "
        in (lines[0].removeprefix("dapo: invalid configuration: "))
    )
    assert main(["validate", f"data.train_files={data}", "data.prompt_key=question"]) == 0


def test_a_model_path_must_be_a_model_directory(tmp_path, capsys):
    empty = tmp_path / "weights"
    empty.mkdir()
    rc, lines = _validate(capsys, f"actor_rollout_ref.model.path={empty}")
    assert (
        rc == 2 and f"actor_rollout_ref.model.path: {empty} is not a Hugging Face model directory" in lines[0]
    )
    # a hub name is not downloaded: the line says how to get it
    rc, lines = _validate(capsys, "actor_rollout_ref.model.path=Qwen/Qwen2.5-32B")
    assert rc == 2 and "huggingface-cli download Qwen/Qwen2.5-32B --local-dir DIR" in lines[0]
    rc, lines = _validate(capsys, f"actor_rollout_ref.model.tokenizer_path={tmp_path}/tok")
    assert (
        rc == 2 and f"actor_rollout_ref.model.tokenizer_path: {tmp_path}/tok is not a directory" in lines[0]
    )
    # a config.json that is not JSON, or no weights beside it: what train would fail on loading
    bad = _model(tmp_path / "badjson")
    (bad / "config.json").write_text("not json")
    rc, lines = _validate(capsys, f"actor_rollout_ref.model.path={bad}")
    assert (
        rc == 2 and f"actor_rollout_ref.model.path: {bad} has a config.json that does not parse" in lines[0]
    )
    bare = _model(tmp_path / "noweights")
    (bare / "model.safetensors").unlink()
    rc, lines = _validate(capsys, f"actor_rollout_ref.model.path={bare}")
    assert rc == 2 and f"actor_rollout_ref.model.path: {bare} has no weights" in lines[0]
    # null (the built-in tiny model) and a real model directory are fine
    assert main(["validate", "actor_rollout_ref.model.path=null"]) == 0
    assert main(["validate", f"actor_rollout_ref.model.path={_model(tmp_path / 'm')}"]) == 0


def test_cuda_must_be_here_and_hold_a_node_of_gpus(capsys, gpus):
    gpus(2)
    assert main(["validate", "trainer.device=cuda", "trainer.n_gpus_per_node=2"]) == 0
    capsys.readouterr()
    rc, lines = _validate(capsys, "trainer.device=cuda", "trainer.n_gpus_per_node=4")
    assert rc == 2
    assert (
        "trainer.n_gpus_per_node=4: this machine has 2 CUDA device(s); set trainer.n_gpus_per_node=2 or fewer"
        in (lines)
    )
    # the other nodes are not this machine's to check
    ok = [
        "trainer.device=cuda",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
        "trainer.worker_backend=ray",
    ]
    ok.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8")  # 128 trajectories over 16 ranks
    assert main(["validate", *ok]) == 0


def test_cpu_runs_never_ask_torch_for_cuda(capsys, monkeypatch):
    def probe():
        raise AssertionError("asked for CUDA devices on a CPU run")

    monkeypatch.setattr(dapo.config.machine, "cuda_device_count", probe)
    assert main(["validate"]) == 0
    code = "import sys, dapo.config.machine; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )


def test_the_dapo_preset_on_a_cpu_machine_names_its_missing_files_and_device(
    capsys, gpus, monkeypatch, tmp_path
):
    gpus(0)
    monkeypatch.setenv("HOME", str(tmp_path))
    rc, lines = _validate(capsys, "-c", "dapo")
    assert rc == 2
    keys = [line.split(":")[0].split("=")[0] for line in lines[1:]]
    assert keys == ["data.train_files", "data.val_files", "trainer.device"]
    assert "~/data/dapo-math-17k.parquet does not exist" in lines[1]


def test_explaining_keys_checks_no_files(capsys):
    assert main(["validate", "--explain", "data.train_files", "data.train_files=/no/such.parquet"]) == 0


def test_vllm_on_cpu_with_a_head_size_its_attention_lacks_is_refused_by_validate(tmp_path, capsys):
    # the built-in tiny models have head size 96 / 4 = 24; a model directory's config.json is read
    assert main(["validate", "actor_rollout_ref.rollout.name=vllm"]) == 2
    err = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.name=vllm: the model's head size is 24, which vLLM's CPU" in err
    model = _model(tmp_path / "m")
    (model / "config.json").write_text('{"hidden_size": 128, "num_attention_heads": 2}')
    args = ["validate", "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.model.path={model}"]
    assert main(args) == 0  # head size 64
    (model / "config.json").write_text('{"hidden_size": 128, "num_attention_heads": 2, "head_dim": 48}')
    assert main(args) == 2
    assert "the model's head size is 48" in capsys.readouterr().err
    assert main(["validate", f"actor_rollout_ref.model.path={model}"]) == 0  # the own engine takes any


def test_an_interpolation_that_does_not_resolve_is_one_line_not_a_rules_traceback(capsys, monkeypatch):
    monkeypatch.delenv("DAPO_TEST_NO_SUCH_VAR", raising=False)
    rc, lines = _validate(capsys, "data.train_files=${oc.env:DAPO_TEST_NO_SUCH_VAR}")
    assert rc == 2 and len(lines) == 1
    assert lines[0].startswith("dapo: invalid configuration: cannot resolve interpolations")
    assert "DAPO_TEST_NO_SUCH_VAR" in lines[0]


def test_gpu_path_server_devices_must_be_devices_the_trainer_sees(capsys, gpus):
    """server_devices count the devices the trainer sees, as its ranks' cuda:i do; an id past
    them is named with the count."""
    gpus(4)
    server = [
        "trainer.device=cuda",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.placement=server",
    ]
    assert main(["validate", *server, "actor_rollout_ref.rollout.server_devices=[2,3]"]) == 0
    capsys.readouterr()
    rc, lines = _validate(capsys, *server, "actor_rollout_ref.rollout.server_devices=[3,4]")
    assert rc == 2
    assert lines == [
        "dapo: invalid configuration: actor_rollout_ref.rollout.server_devices=[3, 4]: this machine shows "
        "4 CUDA device(s) to the trainer, numbered 0 to 3 (within CUDA_VISIBLE_DEVICES when it is set); "
        "pick the server's ids among them"
    ]


def test_gpu_path_server_devices_are_counted_within_the_trainers_visible_devices():
    """The server's CUDA_VISIBLE_DEVICES picks its ids out of the trainer's own list (indices or
    UUIDs), so the config's rule that the trainer's ranks use devices 0 .. n-1 holds however the
    machine's devices were narrowed; an id past the list is refused naming it."""
    from dapo.rollout.vllm_server import visible_devices

    assert visible_devices([2, 3], None) == "2,3"
    assert visible_devices([2, 3], "") == "2,3"
    assert visible_devices([0, 2], "4,5,6,7") == "4,6"
    assert visible_devices([1], "GPU-aa, GPU-bb") == "GPU-bb"
    with pytest.raises(
        ValueError,
        match=r"server_devices=\[2\]: the trainer sees 2 CUDA device\(s\) "
        r"\(CUDA_VISIBLE_DEVICES=4,5\), numbered 0 to 1",
    ):
        visible_devices([2], "4,5")
