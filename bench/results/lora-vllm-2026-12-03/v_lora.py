"""vLLM 0.26 with `enable_lora` on the Llama-3.1-8B shape (dummy weights): batch-1 latency
(128 + 256, 2 warm-up and 5 timed) and 256 x (128 + 256) throughput, through adapters and
through the base, from one engine. Requests go through the adapters in turn (request i
through adapter i mod N), as met's `--lora-dummy N:R` sends them. Sampling as
`vllm bench`: temperature 1, ignore_eos, prompt ids below 10,000.
Usage: v_lora.py MODEL ADAPTER_DIR N R OUT_JSON"""
import json, sys, time

import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest


def main():
    model, adapters, n, r, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    llm = LLM(model=model, load_format="dummy", dtype="bfloat16", max_num_seqs=256, seed=0,
              enable_lora=True, max_loras=n, max_lora_rank=r, max_cpu_loras=n)
    loras = [LoRARequest(f"a{i}", i + 1, f"{adapters}/a{i}") for i in range(n)]
    rng = np.random.default_rng(0)

    def run(batch, lora, input_len=128, output_len=256):
        prompts = [TokensPrompt(prompt_token_ids=p) for p in rng.integers(10000, size=(batch, input_len)).tolist()]
        sp = SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len)
        per = [loras[i % n] for i in range(batch)] if lora else None
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sampling_params=sp, lora_request=per, use_tqdm=False)
        dt = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
        return dt

    result = {}
    for lora in (False, True, False, True):
        tag = "lora" if lora else "base"
        for _ in range(2):
            run(1, lora)
        lat = [run(1, lora) for _ in range(5)]
        run(256, lora)
        tp = [256 * 256 / run(256, lora) for _ in range(2)]
        print(f"{tag}: latency b1 median {np.median(lat):.4f} s {[round(x, 4) for x in lat]}; "
              f"throughput 256x(128+256) {[round(t, 1) for t in tp]} out tok/s", flush=True)
        result.setdefault(tag, []).append({"latency_s": lat, "throughput_tok_s": tp})
    json.dump(result, open(out, "w"))


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file
    main()
