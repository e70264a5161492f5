#!/usr/bin/env python3
"""Converts the hybrid HF fixtures (crates/model-layers/tests/fixtures/hf/{qwen3_next,qwen3_5,
qwen3_5_moe}) to GGUF with llama.cpp's own converter, writing model.gguf beside each
model.safetensors (checked by crates/model-layers/tests/hybrid_gguf.rs).

    python scripts/hybrid_gguf_fixtures.py /path/to/llama.cpp

The llama.cpp checkout is not part of met: pass its root (the directory holding
convert_hf_to_gguf.py and gguf-py/). The committed files were made with the llama.cpp that
llama-cpp-python 0.3.36 vendors, in the /work/venv-ref environment (torch, transformers 5.17).

The fixtures have no tokenizer, and the converter refuses to write a model without a known
one, so its vocabulary step is switched off: the files hold no tokenizer.ggml.* keys (met
reads the vocabulary size off token_embd). Everything else is the converter's unchanged
path: `--outtype bf16` (matrices stay bf16 as saved; 1-D tensors and norms are f32) and
`--no-mtp` (the fixtures have no multi-token-prediction layers).

One more file, qwen3_5/model-mtp.gguf, is the qwen3_5 fixture with a multi-token-prediction
block added as real Qwen3.5 checkpoints carry one (`mtp.fc`, its two input norms, `mtp.norm`
and one full-attention decoder layer `mtp.layers.0.*`, here copies of layer 1's tensors and
random fc/norms), converted with MTP kept: llama.cpp appends it as block 4 with its `nextn`
tensors and sets `nextn_predict_layers`. met does not read that block; the file checks that
it loads the model around it unchanged.
"""

import runpy
import shutil
import sys
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "crates/model-layers/tests/fixtures/hf"
NAMES = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


def convert(llama_cpp: Path, name: str) -> None:
    """Runs the converter on a temp copy of fixture `name` (its weights and configs only)."""
    src = FIXTURES / name
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / name
        model.mkdir()
        for f in ["config.json", "generation_config.json", "model.safetensors"]:
            shutil.copy(src / f, model / f)
        sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py"), str(model), "--outtype", "bf16", "--no-mtp",
                    "--outfile", str(src / "model.gguf")]
        runpy.run_path(sys.argv[0], run_name="__main__")


def convert_with_mtp(llama_cpp: Path) -> None:
    """qwen3_5 plus an MTP block, converted with MTP kept, into qwen3_5/model-mtp.gguf."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    src = FIXTURES / "qwen3_5"
    tensors = load_file(src / "model.safetensors")
    prefix = "model.language_model.layers.1."
    gen = torch.Generator().manual_seed(7)
    for name in [n for n in tensors if n.startswith(prefix)]:
        tensors["mtp.layers.0." + name[len(prefix):]] = tensors[name].clone()
    hidden = tensors["model.language_model.norm.weight"].shape[0]
    dtype = tensors["model.language_model.norm.weight"].dtype
    tensors["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=gen) * 0.05).to(dtype)
    for norm in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]:
        tensors[f"mtp.{norm}.weight"] = (torch.randn(hidden, generator=gen) * 0.1).to(dtype)
    config = json.loads((src / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "qwen3_5"
        model.mkdir()
        shutil.copy(src / "generation_config.json", model / "generation_config.json")
        (model / "config.json").write_text(json.dumps(config, indent=2))
        save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
        sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py"), str(model), "--outtype", "bf16",
                    "--outfile", str(src / "model-mtp.gguf")]
        runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    llama_cpp = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(llama_cpp))
    import conversion.base  # the converter's own package, from the checkout

    conversion.base.TextModel.set_vocab = lambda self: None
    names = sys.argv[2:] or NAMES + ["qwen3_5-mtp"]
    for name in names:
        if name == "qwen3_5-mtp":
            convert_with_mtp(llama_cpp)
        else:
            convert(llama_cpp, name)


if __name__ == "__main__":
    main()
