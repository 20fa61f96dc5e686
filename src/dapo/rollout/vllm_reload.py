"""A weight reload on a vLLM worker that writes the token-embedding tables in place.

vLLM's ``reload_weights`` rebuilds every layer it reloads: it allocates the layer's tensors
afresh, loads them, runs the layer's post-processing and copies the result into the old
storage. For a decoder layer that is a few MiB; for the token embedding (and the output layer
tied to it) it is a second copy of the largest tensor in the model, and the CPU build's
post-processing then packs it for oneDNN while the previous pack is still alive: about twice
the embedding at the peak, which, with the in-process engine, is the trainer's memory.

Here the tables (unquantized ``VocabParallelEmbedding`` layers, the output layer among them)
are kept out of that reload. Their tensors are set aside as the stream passes, the rest goes
to vLLM's reload, and then the tables are written in place through vLLM's own
``load_weights`` (which loads a tied output layer once, through the embedding) after their
oneDNN packs are released; their post-processing (``process_weights_after_loading``) then
packs them again from the new weights. A table larger than the sync's bucket comes as blocks of
rows instead, each written into the table's storage as it arrives
(:mod:`dapo.rollout.vllm_table_rows`), so that no whole copy of it exists on the way. The tables'
new weights thus cost nothing beyond the stream's own tensors, and at most one pack is rebuilt
at a time. Between the other modules the heap's free pages go back to the system
(:func:`trim_heap`), so what is left is vLLM's copy of one layer and its new pack.

Loaded inside vLLM's worker processes (``dapo.rollout.vllm_weight_stream.WeightReceiver``);
vLLM is imported only when a worker reloads.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from dapo.checkpoint.rows import RowAssembly, RowBlock
from dapo.rollout.vllm_table_rows import TableRows

# vLLM's loggers that report, during a reload, the tables loaded here as not loaded
_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)

logger = logging.getLogger(__name__)
_warned_whole: set[str] = set()  # one warning per parameter for the process's life, not per sync


def embedding_tables(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The unquantized token-embedding layers (input embedding, output layer) by qualified name;
    a tied pair appears under both names."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    return {
        name: m
        for name, m in model.named_modules(remove_duplicate=False)
        if isinstance(m, VocabParallelEmbedding)
        and isinstance(getattr(m, "quant_method", None), UnquantizedEmbeddingMethod)
        and not m.weight.is_meta
    }


def table_weight_names(tables: dict[str, torch.nn.Module]) -> set[str]:
    """The tables' parameters under vLLM's names."""
    return {f"{prefix}.{p}" for prefix, m in tables.items() for p, _ in m.named_parameters(recurse=False)}


def table_weight(model: torch.nn.Module, name: str, table_names: set[str]) -> str | None:
    """The tables' weight (vLLM's name) that the checkpoint weight ``name`` is, directly or
    through the model's checkpoint-name mapping; None for any other weight."""
    if name in table_names:
        return name
    map_name = getattr(getattr(model, "hf_to_vllm_mapper", None), "map_name", None)
    mapped = map_name(name) if map_name is not None else None
    return mapped if mapped in table_names else None


def whole_tensors(
    weights: Iterable[tuple[str, torch.Tensor | RowBlock]],
    assembly: RowAssembly,
    assembled: set[str] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with blocks of rows put together (vLLM's loaders take whole tensors), their
    names added to ``assembled``; raises at the end if one stayed incomplete. A tensor sent in
    blocks is sent so because it is too large to hold whole on the way, so putting it together
    here is worth a warning (once per name)."""
    for name, t in weights:
        if isinstance(t, RowBlock):
            t = assembly.add(name, t.start, t.rows, t.rows.dtype, t.shape)
            if t is None:
                continue
            if assembled is not None:
                assembled.add(name)
            if name not in _warned_whole:
                _warned_whole.add(name)
                logger.warning(
                    "weight sync: %s (%.1f MiB) was sent in blocks of rows and is put together whole "
                    "in vLLM's worker: no in-place writer for it",
                    name,
                    t.nbytes / 2**20,
                )
        yield name, t
        del t
    assembly.check_complete()


def check_tables_covered(params: dict[str, torch.Tensor], sent: Iterable[str | None]) -> None:
    """Every distinct table parameter (vLLM's names in ``params``) received under one of its names
    (``sent``); a tied pair is one parameter under two names, either of which covers it. Without
    this an untied table left out of the stream would keep its old weights with no word."""
    covered = {id(params[n]) for n in sent if n is not None}
    missing = sorted({id(p): n for n, p in reversed(params.items()) if id(p) not in covered}.values())
    if missing:
        raise RuntimeError(f"the weights sent to vLLM lack its embedding table {', '.join(missing)}")


class _HideTablesNotLoaded(logging.Filter):
    """Drops vLLM's "not loaded" warnings when they name only the tables this module loads."""

    def __init__(self, class_names: set[str], weight_names: set[str]):
        super().__init__()
        self.class_names, self.weight_names = class_names, weight_names

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if not args or record.levelno != logging.WARNING:
            return True
        first = args[0]
        if isinstance(first, str) and "Failed to load weights" in str(record.msg):
            return first not in self.class_names
        if isinstance(first, set) and "were not loaded" in str(record.msg):
            return not first <= self.weight_names
        return True


@contextmanager
def tables_left_out_quietly(tables: dict[str, torch.nn.Module], weight_names: set[str]) -> Iterator[None]:
    """vLLM's reload without its warnings about the tables it was not given."""
    f = _HideTablesNotLoaded({type(m).__name__ for m in tables.values()}, weight_names)
    loggers = [logging.getLogger(n) for n in _RELOAD_LOGGERS]
    for log in loggers:
        log.addFilter(f)
    try:
        yield
    finally:
        for log in loggers:
            log.removeFilter(f)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; other C libraries have none
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Give the heap's free pages back to the system. Without it glibc keeps the layer copies
    vLLM's reload frees (its mmap threshold rises as large blocks are freed, so later ones come
    from the heap) and the first syncs grew the trainer's peak by up to a quarter of the model."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_packs(tables: dict[str, torch.nn.Module]) -> None:
    """Drop the CPU build's packed copies of the tables (held by their ``cpu_linear``), before the
    new ones are made, so that old and new never coexist."""
    for m in {id(m): m for m in tables.values()}.values():
        if "cpu_linear" in vars(m):
            del m.cpu_linear


@torch.no_grad()
def load_tables_in_place(
    model: torch.nn.Module,
    tables: dict[str, torch.nn.Module],
    weights: list[tuple[str, torch.Tensor]],
    rows: TableRows,
) -> None:
    """Finish the tables whose rows were written during the stream, write the whole ``weights``
    (the tables' checkpoint tensors) into their own storage, then run each table's
    post-processing, as vLLM does after loading."""
    rows.finish(tables)
    release_packs(tables)
    if weights:
        model.load_weights(weights)
    for m in {id(m): m for m in tables.values()}.values():
        m.quant_method.process_weights_after_loading(m)


def largest_numel(worker: Any) -> int:
    """The most elements a checkpoint tensor for ``worker`` holds: no checkpoint tensor holds more
    than the largest of its shards, whole."""
    tp = int(getattr(worker.vllm_config.parallel_config, "tensor_parallel_size", 1) or 1)
    return max((p.numel() for p in worker.get_model().parameters()), default=0) * tp


def reload_with_tables_in_place(worker: Any, weights: Iterable[tuple[str, torch.Tensor | RowBlock]]) -> None:
    """``worker.reload_weights(weights_iterator=weights)``, with the tables written in place (an
    unquantized model; a quantized one is reloaded by vLLM alone). A table's blocks of rows are
    written at their place as they arrive (:mod:`dapo.rollout.vllm_table_rows`); any other
    tensor sent in blocks is put together first. What went which way is left on the worker as
    ``dapo_last_reload`` (table weights written in place by rows, tensors put together whole)."""
    from vllm.config import set_current_vllm_config

    model = worker.get_model()
    quantized = worker.vllm_config.model_config.quantization is not None
    tables = {} if quantized else embedding_tables(model)
    assembly = RowAssembly("weight sync", max_numel=largest_numel(worker))
    assembled: set[str] = set()
    worker.dapo_last_reload = {"in_place": set(), "assembled": assembled}
    if not tables:
        worker.reload_weights(weights_iterator=whole_tensors(weights, assembly, assembled))
        return
    names = table_weight_names(tables)
    rows = TableRows(tables)  # holds the tables' parameters, which the reload puts on meta
    worker.dapo_last_reload["in_place"] = rows.seen.keys()
    params = {n: getattr(tables[n.rpartition(".")[0]], n.rpartition(".")[2]) for n in sorted(names)}
    held: list[tuple[str, torch.Tensor]] = []

    def table_rows_written() -> Iterator[tuple[str, torch.Tensor | RowBlock]]:
        for name, t in weights:
            table = table_weight(model, name, names)
            if isinstance(t, RowBlock) and table is not None and rows.takes(table):
                rows.write(table, t)
                del t
                continue
            yield name, t
            del t

    def others() -> Iterator[tuple[str, torch.Tensor]]:
        module = None
        for name, t in whole_tensors(table_rows_written(), assembly, assembled):
            if table_weight(model, name, names) is not None:
                held.append((name, t))  # the stream's own tensor: no copy
                continue
            if name.rsplit(".", 2)[0] != module:  # the previous module's copies are freed by now
                module = name.rsplit(".", 2)[0]
                trim_heap()
            yield name, t

    with tables_left_out_quietly(tables, names):
        worker.reload_weights(weights_iterator=others())
    if not held and not rows.written:  # vLLM's own warning about it is filtered out above
        raise RuntimeError(
            f"the weights sent to vLLM hold none of its embedding tables ({', '.join(sorted(names))})"
        )
    check_tables_covered(params, [*rows.seen, *(table_weight(model, n, names) for n, _ in held)])
    with set_current_vllm_config(worker.vllm_config):
        load_tables_in_place(model, tables, held, rows)
