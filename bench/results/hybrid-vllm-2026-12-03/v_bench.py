"""vLLM 0.26 on a hybrid config with dummy weights: what `vllm bench latency` (batch 1,
128 + 256, 2 warm-up and 5 timed iterations) and `vllm bench throughput` (256 random
prompts of 128 tokens, 256 new each) measure, from one engine so the model is built and
compiled once. Sampling and prompts follow those two commands (temperature 1, ignore_eos,
prompt ids below 10,000)."""
import json, sys, time

import numpy as np
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

def main():
    model, out = sys.argv[1], sys.argv[2]
    llm = LLM(model=model, load_format="dummy", dtype="bfloat16", language_model_only=True,
              max_num_seqs=256, seed=0,
              gdn_prefill_backend="triton")  # flashinfer is not carried to the machine
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
    print(f"latency b1: median {np.median(lat):.4f} s mean {np.mean(lat):.4f} s  all {[round(x, 4) for x in lat]}", flush=True)
    run(256)  # the throughput run's own warm-up is its engine's; one untimed pass evens the odds with met's warm-up
    tp = [run(256) for _ in range(2)]
    toks = 256 * 256
    print(f"throughput 256x(128+256): {[round(toks / t, 1) for t in tp]} output tok/s (elapsed {[round(t, 3) for t in tp]} s)", flush=True)
    json.dump({"latency_s": lat, "throughput_elapsed_s": tp, "output_tokens": toks}, open(out, "w"))


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file
    main()
