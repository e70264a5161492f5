#!/usr/bin/env python3
"""Writes a word-level `tokenizer.json` of a config's whole vocabulary, so `met serve` can run
a dummy-weight model (`--load-format dummy`) from a `configs/` directory, which has none.

Usage: dummy_tokenizer.py CONFIG_DIR OUT_DIR. OUT_DIR gets CONFIG_DIR's files and a
tokenizer.json whose token i is the word `t<i>` (split on whitespace). Benchmarks send
token-id prompts, so only the served text is made of these words. Needs the `tokenizers`
package (it comes with transformers).
"""

import json
import shutil
import sys

from tokenizers import Tokenizer, models, pre_tokenizers


def main():
    src, out = sys.argv[1], sys.argv[2]
    shutil.copytree(src, out, dirs_exist_ok=True)
    with open(f"{src}/config.json") as f:
        config = json.load(f)
    # A vision-language config (Qwen3.5) keeps its text model's fields in `text_config`.
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(f"{out}/tokenizer.json")
    print(f"{out}/tokenizer.json: {vocab_size} tokens")


if __name__ == "__main__":
    main()
