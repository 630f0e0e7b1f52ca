#!/usr/bin/env python3
"""HF transformers' generate on rollout_bench's model shape, and baton's
rollout_bench interleaved with it in the same run.

    /opt/baton-venv/bin/python bench/hf_generate_compare.py \
        [--batches 1,16,64] [--prompt 32] [--new 32] [--repeats 3] [--rounds 3] \
        [--threads N] [--baton-bin build/bench/rollout_bench]

The model is rollout_bench's: LlamaForCausalLM, vocab 2048, hidden 256,
intermediate 704, 4 layers, 8 heads / 4 KV heads, fp32, seeded random weights
(not baton's weights: speed does not depend on their values). Each of B
prompts has --prompt random tokens, no padding; greedy, EOS ignored, exactly
--new new tokens, KV cache on (transformers' default dynamic cache), SDPA and
eager attention both measured.

With --baton-bin, each round runs, batch by batch, rollout_bench (one timed
generation after its warm-up) and then HF's --repeats generations with each
attention, so that both see the same machine load; a small shared VM's speed
drifts by tens of percent from minute to minute. Figures are medians over all
rounds.

Prints one JSON object: per batch, generated tokens/s of HF generate (SDPA and
eager), baton's cached_tokens_per_s (packed steps) and padded_tokens_per_s,
and baton over the faster of HF's two.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def run_baton(binary, batch, args):
    cmd = [binary, "--batches", str(batch), "--prompt", str(args.prompt), "--new",
           str(args.new), "--repeats", "1", "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])["results"][0]
    if not row["same_tokens"]:
        sys.exit(f"rollout_bench: packed, padded and uncached tokens differ at batch {batch}")
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--baton-bin", default=None)
    args = p.parse_args()

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    models = {}
    for attn in ("sdpa", "eager"):
        cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=704,
                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                          max_position_embeddings=args.prompt + args.new, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, eos_token_id=2)
        cfg._attn_implementation = attn
        models[attn] = LlamaForCausalLM(cfg).eval()

    batches = [int(x) for x in args.batches.split(",")]
    rates = {}  # (system, batch) -> [tokens/s]
    for rnd in range(args.rounds):
        for b in batches:
            if args.baton_bin:
                row = run_baton(args.baton_bin, b, args)
                rates.setdefault(("baton", b), []).append(row["cached_tokens_per_s"])
                rates.setdefault(("baton_padded", b), []).append(row["padded_tokens_per_s"])
            gen = torch.Generator().manual_seed(42 + b)
            ids = torch.randint(3, 2048, (b, args.prompt), generator=gen)
            kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                      min_new_tokens=args.new, do_sample=False, use_cache=True,
                      eos_token_id=None, pad_token_id=0)
            for attn, model in models.items():
                with torch.inference_mode():
                    if rnd == 0:
                        model.generate(ids, **kw)  # warm-up
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        out = model.generate(ids, **kw)
                        dt = time.perf_counter() - t
                        assert out.shape == (b, args.prompt + args.new), out.shape
                        rates.setdefault((attn, b), []).append(b * args.new / dt)

    results = []
    for b in batches:
        row = {"batch": b,
               "hf_sdpa_tokens_per_s": statistics.median(rates[("sdpa", b)]),
               "hf_eager_tokens_per_s": statistics.median(rates[("eager", b)])}
        best_hf = max(row["hf_sdpa_tokens_per_s"], row["hf_eager_tokens_per_s"])
        if args.baton_bin:
            row["baton_tokens_per_s"] = statistics.median(rates[("baton", b)])
            row["baton_padded_tokens_per_s"] = statistics.median(rates[("baton_padded", b)])
            row["baton_over_hf"] = row["baton_tokens_per_s"] / best_hf
        print(json.dumps(row), file=sys.stderr)
        results.append(row)

    print(json.dumps({"bench": "hf_generate", "torch": torch.__version__,
                      "transformers": transformers.__version__, "threads": args.threads,
                      "prompt_tokens": args.prompt, "new_tokens": args.new,
                      "repeats": args.repeats, "rounds": args.rounds, "results": results}))


if __name__ == "__main__":
    main()
