#!/usr/bin/env python3
"""HF transformers' generate on rollout_bench's model shape, for comparison.

    /opt/baton-venv/bin/python bench/hf_generate_compare.py \
        [--batches 1,16,64] [--prompt 32] [--new 32] [--repeats 3] [--threads N] \
        [--baton-json FILE]

The model is rollout_bench's: LlamaForCausalLM, vocab 2048, hidden 256,
intermediate 704, 4 layers, 8 heads / 4 KV heads, fp32, seeded random weights
(not baton's weights: speed does not depend on their values). Each of B
prompts has --prompt random tokens, no padding; greedy, EOS ignored, exactly
--new new tokens, KV cache on (transformers' default dynamic cache), eager
attention and SDPA both measured. Medians of --repeats after a warm-up.

Prints one JSON object: per batch, generated tokens/s of HF generate. With
--baton-json (rollout_bench's output), adds baton's cached_tokens_per_s for the
same batch and the ratio baton / HF.
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--baton-json", default=None)
    args = p.parse_args()

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    baton = {}
    if args.baton_json:
        with open(args.baton_json) as f:
            for row in json.load(f)["results"]:
                baton[row["batch"]] = row["cached_tokens_per_s"]

    results = []
    for attn in ("sdpa", "eager"):
        cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=704,
                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                          max_position_embeddings=args.prompt + args.new, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, eos_token_id=2)
        cfg._attn_implementation = attn
        model = LlamaForCausalLM(cfg).eval()
        for b in (int(x) for x in args.batches.split(",")):
            gen = torch.Generator().manual_seed(42 + b)
            ids = torch.randint(3, 2048, (b, args.prompt), generator=gen)
            mask = torch.ones_like(ids)
            kw = dict(attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new,
                      do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
            with torch.inference_mode():
                model.generate(ids, **kw)  # warm-up
                rates = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    out = model.generate(ids, **kw)
                    dt = time.perf_counter() - t
                    assert out.shape == (b, args.prompt + args.new), out.shape
                    rates.append(b * args.new / dt)
            row = {"attn": attn, "batch": b, "hf_tokens_per_s": statistics.median(rates)}
            if b in baton:
                row["baton_tokens_per_s"] = baton[b]
                row["baton_over_hf"] = baton[b] / row["hf_tokens_per_s"]
            print(json.dumps(row), file=sys.stderr)
            results.append(row)

    print(json.dumps({"bench": "hf_generate", "torch": torch.__version__,
                      "transformers": transformers.__version__, "threads": args.threads,
                      "prompt_tokens": args.prompt, "new_tokens": args.new,
                      "repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
