"""vLLM 0.26 with `quantization="fp8"` on the Llama-3.1-8B shape (dummy bf16 weights that
vLLM quantizes to e4m3 at load, per tensor, activations per token): batch-1 latency
(128 + 256, 2 warm-up and 5 timed) and 256 x (128 + 256) throughput, as `met bench` runs
FP8 (issue 34). Sampling as `vllm bench`: temperature 1, ignore_eos, prompt ids below
10,000. Usage: v_fp8.py MODEL OUT_JSON"""
import json, sys, time

import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def main():
    model, out = sys.argv[1], sys.argv[2]
    llm = LLM(model=model, load_format="dummy", dtype="bfloat16", quantization="fp8", max_num_seqs=256, seed=0)
    rng = np.random.default_rng(0)

    def run(batch, input_len=128, output_len=256):
        prompts = [TokensPrompt(prompt_token_ids=p) for p in rng.integers(10000, size=(batch, input_len)).tolist()]
        sp = SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sampling_params=sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
        return dt

    for _ in range(2):
        run(1)
    lat = [run(1) for _ in range(5)]
    run(256)
    tp = [256 * 256 / run(256) for _ in range(2)]
    print(f"fp8: latency b1 median {np.median(lat):.4f} s {[round(x, 4) for x in lat]}; "
          f"throughput 256x(128+256) {[round(t, 1) for t in tp]} out tok/s", flush=True)
    json.dump({"latency_s": lat, "throughput_tok_s": tp}, open(out, "w"))


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file
    main()
