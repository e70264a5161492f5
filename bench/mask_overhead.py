"""Per-token cost of structured output on a running `met serve`: decode tokens/s of the same
prompts with `response_format` json_schema and without, alternating which goes first.

Each prompt is first answered under its JSON Schema (greedy, streamed, at most 200 tokens);
the unconstrained twin then generates exactly as many tokens (`ignore_eos`, same prompt), so
both modes decode the same number of tokens from the same context length. Requests run one
at a time (concurrency 1): decode time is from the first streamed token to the last, so
prefill, and the schema's compilation before the first step, are outside it.

    python bench/mask_overhead.py --base-url http://127.0.0.1:8899 --rounds 4 --out DIR
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from openai import OpenAI

NAME = {"type": "string", "maxLength": 24}
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
               "required": ["name", "age"], "additionalProperties": False},
    "city": {"type": "object", "properties": {"city": NAME, "country": NAME,
             "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
             "required": ["city", "country", "population"], "additionalProperties": False},
    "todo": {"type": "object", "properties": {"title": NAME, "items": {"type": "array", "items": NAME, "minItems": 1,
             "maxItems": 3}, "done": {"type": "boolean"}}, "required": ["title", "items", "done"],
             "additionalProperties": False},
    "verdict": {"type": "object", "properties": {"answer": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 80}},
                "required": ["answer", "reason"], "additionalProperties": False},
}
PROMPTS = [
    ("Describe a person called Alice who is 30 years old.", "person"),
    ("Make up a character for a children's story.", "person"),
    ("Tell me about Paris.", "city"),
    ("Describe a small town in Canada.", "city"),
    ("Plan my morning.", "todo"),
    ("List the steps to bake a cake.", "todo"),
    ("Is the sky blue? Explain.", "verdict"),
    ("Can fish climb trees? Explain.", "verdict"),
]


def timed(client, model, prompt, **kw):
    """Completion tokens, decode seconds (first to last token) and the text."""
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0.0, stream=True,
        stream_options={"include_usage": True}, **kw)
    first = last = None
    text, tokens = "", 0
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            if c.delta.content:
                text += c.delta.content
                first = first or now
                last = now
    return tokens, (last - first) if first else 0.0, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url + "/v1", api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    # Warm-up: builds the grammar engine's token trie and compiles each schema once.
    for prompt, schema in PROMPTS[:4]:
        timed(client, model, prompt, max_tokens=8, response_format=fmt(schema))
    rounds = []
    for r in range(args.rounds):
        order = ["schema", "free"] if r % 2 == 0 else ["free", "schema"]
        totals = {"schema": [0, 0.0], "free": [0, 0.0]}
        lengths = {}
        for prompt, schema in PROMPTS:
            # The schema's length comes first either way: the free twin needs it.
            if prompt not in lengths:
                n, _, text = timed(client, model, prompt, max_tokens=200, response_format=fmt(schema))
                json.loads(text)
                lengths[prompt] = n
        for mode in order:
            for prompt, schema in PROMPTS:
                n = lengths[prompt]
                if mode == "schema":
                    got, secs, _ = timed(client, model, prompt, max_tokens=200, response_format=fmt(schema))
                else:
                    got, secs, _ = timed(client, model, prompt, max_tokens=n, extra_body={"ignore_eos": True})
                totals[mode][0] += max(got - 1, 0)
                totals[mode][1] += secs
        row = {m: totals[m][0] / totals[m][1] for m in totals}
        row["order"] = order
        row["tokens"] = totals["schema"][0]
        rows = f"round {r + 1} ({order[0]} first): schema {row['schema']:.1f} tok/s, free {row['free']:.1f} tok/s"
        print(rows, flush=True)
        rounds.append(row)
    ratios = [r["schema"] / r["free"] for r in rounds]
    summary = {
        "rounds": rounds,
        "schema_tok_s_median": statistics.median(r["schema"] for r in rounds),
        "free_tok_s_median": statistics.median(r["free"] for r in rounds),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": schema, "schema": SCHEMAS[schema], "strict": True}}


if __name__ == "__main__":
    main()
