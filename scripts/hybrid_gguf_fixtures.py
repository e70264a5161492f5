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


def main() -> None:
    llama_cpp = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(llama_cpp))
    import conversion.base  # the converter's own package, from the checkout

    conversion.base.TextModel.set_vocab = lambda self: None
    for name in NAMES:
        convert(llama_cpp, name)


if __name__ == "__main__":
    main()
