"""vLLM 0.26 beside met on FP8 weights: the Llama-3.1-8B shape with dummy bf16 weights that
vLLM quantizes itself (`quantization="fp8"`: per-tensor e4m3 weights, dynamic per-token
activations), as the issue's comparison asks. Batch-1 latency (128 + 256, 2 warm-up and 5
timed requests) and 256 x (128 + 256) throughput (one untimed pass, two timed), from one
engine, sampling as `vllm bench` does (temperature 1, ignore_eos, prompt ids below 10,000).

Usage, on the H200 after `.peer`'s install.sh staged vLLM into /tmp/site:
    PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
      python3 v_fp8.py /tmp/peer-model/Llama-3.1-8B-Instruct out.json [fp8|none]
"""
import json
import sys
import time

import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def main():
    model, out = sys.argv[1], sys.argv[2]
    quantization = None if len(sys.argv) < 4 or sys.argv[3] == "none" else sys.argv[3]
    llm = LLM(model=model, load_format="dummy", dtype="bfloat16", quantization=quantization,
              max_num_seqs=256, seed=0)
    rng = np.random.default_rng(0)

    def timed(batch, input_len=128, output_len=256):
        ids = rng.integers(10000, size=(batch, input_len)).tolist()
        params = SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len)
        start = time.perf_counter()
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], sampling_params=params,
                               use_tqdm=False)
        elapsed = time.perf_counter() - start
        assert all(len(r.outputs[0].token_ids) == output_len for r in results)
        return elapsed

    for _ in range(2):
        timed(1)
    latency = [timed(1) for _ in range(5)]
    print(f"latency b1 ({quantization}): median {np.median(latency):.4f} s a request, "
          f"all {[round(x, 4) for x in latency]}", flush=True)
    timed(256)
    throughput = [timed(256) for _ in range(2)]
    tokens = 256 * 256
    print(f"throughput 256x(128+256) ({quantization}): {[round(tokens / t, 1) for t in throughput]} output tok/s",
          flush=True)
    with open(out, "w") as f:
        json.dump({"quantization": quantization, "latency_s": latency, "throughput_elapsed_s": throughput,
                   "output_tokens": tokens}, f)


if __name__ == "__main__":  # vLLM's engine process imports this file
    main()
