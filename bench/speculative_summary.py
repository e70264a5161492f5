"""Medians of bench/speculative_cpu.sh's rounds, as a Markdown table, and whether the two
modes' answers were identical. Usage: python3 bench/speculative_summary.py OUT_DIR ROUNDS"""

import json
import statistics
import sys


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    rows = {}
    outputs = {}
    for mode in ("off", "ngram"):
        for r in range(1, rounds + 1):
            run = json.load(open(f"{out}/{mode}-{r}.json"))["runs"][0]
            spec = run.get("speculative") or {}
            rows.setdefault(mode, []).append({
                "decode_tok_s": 1000.0 / run["tpot_ms"]["p50"],
                "output_tok_s": run["output_throughput"],
                "tpot_p50": run["tpot_ms"]["p50"],
                "ttft_p50": run["ttft_ms"]["p50"],
                "completed": run["completed"],
                "output_tokens": run["output_tokens"],
                "acceptance": spec.get("acceptance_rate"),
                "tokens_per_step": spec.get("tokens_per_step"),
            })
            outputs[(mode, r)] = json.load(open(f"{out}/{mode}-{r}.outputs.json"))
    med = {m: {k: statistics.median(x[k] for x in v) if v[0][k] is not None else None for k in v[0]} for m, v in rows.items()}
    print("| mode | decode tok/s (1000 / TPOT p50) | output tok/s | TPOT p50 ms | TTFT p50 ms | acceptance | tokens per step |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in ("off", "ngram"):
        d = med[m]
        acc = "-" if d["acceptance"] is None else f"{d['acceptance']:.2f}"
        tps = "-" if d["tokens_per_step"] is None else f"{d['tokens_per_step']:.2f}"
        print(f"| {m} | {d['decode_tok_s']:.1f} | {d['output_tok_s']:.1f} | {d['tpot_p50']:.1f} | {d['ttft_p50']:.0f} | {acc} | {tps} |")
    print()
    print(f"ngram / off, medians: decode {med['ngram']['decode_tok_s'] / med['off']['decode_tok_s']:.2f}x, "
          f"output throughput {med['ngram']['output_tok_s'] / med['off']['output_tok_s']:.2f}x")
    for m in ("off", "ngram"):
        print(f"{m} per round: decode tok/s " + ", ".join(f"{x['decode_tok_s']:.1f}" for x in rows[m])
              + "; output tok/s " + ", ".join(f"{x['output_tok_s']:.1f}" for x in rows[m])
              + "; completed " + ", ".join(str(x["completed"]) for x in rows[m]))
    reference = outputs[("off", 1)]
    same = all(o == reference for o in outputs.values())
    print(f"answers (text, tokens, finish reason) identical across every mode and round: {same}")


if __name__ == "__main__":
    main()
