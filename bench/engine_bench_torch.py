#!/usr/bin/env python3
"""engine_bench's model in PyTorch eager: the reference bench/engine_bench compares TP1 with.

The same config, weights, batch, micro-batches, loss and thread count as
engine_bench's TP1 layout, run as an HF transformers ``LlamaForCausalLM``
(eager attention, or --attn sdpa) in one process:

    /opt/baton-venv/bin/python bench/engine_bench_torch.py [--threads N] [--warmup 1] [--iters 3]
                                                         [--profile DIR] [--shape default|add3]
    /opt/baton-venv/bin/python bench/engine_bench_torch.py --summarize DIR

(/opt/baton-venv comes from scripts/setup_python.sh: PyPI's torch, the same
LibTorch release the engine links, plus transformers.) The last line
of stdout is one JSON object; pass a file holding it to
``engine_bench --torch-json FILE``.

Timed like engine_bench (median of --iters after --warmup, tokens = B*S):
  fwd_bwd     forward + backward of every micro-batch (loss = token mean of
              -log p over all B*(S-1) next-token positions, gradients accumulated)
  train_step  fwd_bwd + clip_grad_norm_(1.0) + AdamW step
  logprob     no_grad forward + log_softmax/gather of every micro-batch
Weights and tokens are drawn from seeded torch.Generators in the order
engine_bench draws them (ATen's CPU generator, the same from C++ and Python), so
first_loss and mean_log_prob must equal engine_bench's.
"""
import argparse
import json
import os
import statistics
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

# Keep in step with BenchConfig in bench/engine_bench.cpp.
CONFIG = dict(vocab=2048, hidden=256, intermediate=704, layers=4, heads=8, kv_heads=4,
              batch=8, seq=48, micro=2, seed=1234, init_std=0.02)
# BenchConfig::add3(): the GRPO add3 task's update.
SHAPES = {"default": CONFIG,
          "add3": dict(CONFIG, vocab=19, hidden=128, intermediate=256, layers=6, heads=4,
                       kv_heads=4, batch=128, seq=18, micro=64)}


def hf_weights(c):
    g = torch.Generator().manual_seed(c["seed"])

    def normal(*shape):
        return torch.normal(0.0, c["init_std"], shape, generator=g)

    h, f, d = c["hidden"], c["intermediate"], c["hidden"] // c["heads"]
    q, kv = c["heads"] * d, c["kv_heads"] * d
    w = {"model.embed_tokens.weight": normal(c["vocab"], h)}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(q, h)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, q)
        w[p + "mlp.gate_proj.weight"] = normal(f, h)
        w[p + "mlp.up_proj.weight"] = normal(f, h)
        w[p + "mlp.down_proj.weight"] = normal(h, f)
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
    w["model.norm.weight"] = torch.ones(h)
    w["lm_head.weight"] = normal(c["vocab"], h)
    return w


def blas_library():
    """The BLAS library this process loaded (see engine_bench.cpp)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line[line.find("/"):].strip() if "/" in line else ""
            if "blas" in path:
                return os.path.realpath(path)
    return "unknown"


def self_times(path):
    """Self time (ms) and call count per op name in a Chrome trace of the autograd profiler."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    by_thread = {}
    for e in events:
        if e.get("ph") == "X":
            by_thread.setdefault(e.get("tid"), []).append(e)
    ms, calls = {}, {}
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack = []  # [end, name, self]
        for e in evs:
            ts, dur = float(e["ts"]), float(e["dur"])
            while stack and ts >= stack[-1][0]:
                end, name, own = stack.pop()
                ms[name] = ms.get(name, 0.0) + own / 1e3
            if stack:
                stack[-1][2] -= dur
            stack.append([ts + dur, e["name"], dur])
            calls[e["name"]] = calls.get(e["name"], 0) + 1
        for end, name, own in stack:
            ms[name] = ms.get(name, 0.0) + own / 1e3
    return ms, calls


def summarize(trace_dir, top=15):
    """Prints baton's and torch's self time per op side by side, for each phase."""
    for phase in ("fwd_bwd", "logprob"):
        b, t = (self_times(os.path.join(trace_dir, f"{who}_{phase}.trace"))
                for who in ("baton", "torch"))
        print(f"{phase}: total self time baton {sum(b[0].values()):.1f} ms, "
              f"torch {sum(t[0].values()):.1f} ms")
        print(f"  {'op':<44} {'baton ms':>9} {'calls':>6} {'torch ms':>9} {'calls':>6}")
        names = sorted(set(b[0]) | set(t[0]), key=lambda n: -(b[0].get(n, 0) + t[0].get(n, 0)))
        for n in names[:top]:
            print(f"  {n[:44]:<44} {b[0].get(n, 0):9.1f} {b[1].get(n, 0):6d} "
                  f"{t[0].get(n, 0):9.1f} {t[1].get(n, 0):6d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--profile", metavar="DIR",
                    help="after timing, write Chrome traces of one log-prob pass and one "
                         "forward+backward (autograd profiler) to DIR/torch_*.trace")
    ap.add_argument("--summarize", metavar="DIR",
                    help="only print the self time per op of DIR/{baton,torch}_*.trace "
                         "(written by both --profile options) and exit")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="default",
                    help="engine_bench's --shape: the model and batch")
    ap.add_argument("--attn", choices=["eager", "sdpa"], default="eager",
                    help="HF's attention implementation (sdpa: what TRL runs by default)")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    torch.set_num_threads(args.threads)
    c = SHAPES[args.shape]

    hf_config = LlamaConfig(
        vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
        num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"], max_position_embeddings=c["seq"], rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu", use_cache=False,
        torch_dtype="float32")
    hf_config._attn_implementation = args.attn
    model = LlamaForCausalLM(hf_config)
    model.load_state_dict(hf_weights(c))
    assert model.config._attn_implementation == args.attn

    g = torch.Generator().manual_seed(c["seed"] + 1)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), generator=g)
    pos = torch.arange(c["seq"]).unsqueeze(0).expand(c["batch"], -1).contiguous()
    mask = torch.ones(c["batch"], c["seq"], dtype=torch.long)
    mbs = [(ids[r:r + c["micro"]], pos[r:r + c["micro"]], mask[r:r + c["micro"]])
           for r in range(0, c["batch"], c["micro"])]
    positions = c["batch"] * (c["seq"] - 1)
    tokens = c["batch"] * c["seq"]

    def log_probs(mb):
        i, p, m = mb
        logits = model(input_ids=i, attention_mask=m, position_ids=p, use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        return lp.gather(-1, i[:, 1:].unsqueeze(-1)).squeeze(-1)

    model.eval()
    logprob_s, lp_sum = [], 0.0
    with torch.no_grad():
        for it in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            outs = [log_probs(mb) for mb in mbs]
            dt = time.perf_counter() - t0
            if it >= args.warmup:
                logprob_s.append(dt)
            if it == 0:
                lp_sum = sum(o.sum().item() for o in outs)

    model.train()
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-5)
    fwd_bwd_s, step_s, first_loss = [], [], 0.0
    for it in range(args.warmup + args.iters):
        opt.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        losses = []
        for mb in mbs:
            loss = -log_probs(mb).sum() / positions
            loss.backward()
            losses.append(loss.detach())
        fb = time.perf_counter() - t0
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        st = time.perf_counter() - t0
        if it >= args.warmup:
            fwd_bwd_s.append(fb)
            step_s.append(st)
        if it == 0:
            first_loss = sum(x.item() for x in losses)

    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        model.eval()
        with torch.no_grad(), torch.autograd.profiler.profile(use_kineto=False) as prof:
            [log_probs(mb) for mb in mbs]
        prof.export_chrome_trace(os.path.join(args.profile, "torch_logprob.trace"))
        model.train()
        opt.zero_grad(set_to_none=False)
        with torch.autograd.profiler.profile(use_kineto=False) as prof:
            for mb in mbs:
                (-log_probs(mb).sum() / positions).backward()
        prof.export_chrome_trace(os.path.join(args.profile, "torch_fwd_bwd.trace"))

    out = {
        "impl": f"HF LlamaForCausalLM, {args.attn} attention",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "blas": blas_library(),
        "config": c,
        "fwd_bwd_tokens_per_s": tokens / statistics.median_high(fwd_bwd_s),
        "train_step_tokens_per_s": tokens / statistics.median_high(step_s),
        "logprob_tokens_per_s": tokens / statistics.median_high(logprob_s),
        "fwd_bwd_s": fwd_bwd_s,
        "train_step_s": step_s,
        "logprob_s": logprob_s,
        "first_loss": first_loss,
        "mean_log_prob": lp_sum / positions,
    }
    print(f"torch eager ({out['threads']} threads): fwd+bwd {out['fwd_bwd_tokens_per_s']:.0f} "
          f"tok/s, train step {out['train_step_tokens_per_s']:.0f} tok/s, log-probs "
          f"{out['logprob_tokens_per_s']:.0f} tok/s (first loss {first_loss:.6f}, mean log-prob "
          f"{out['mean_log_prob']:.6f})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
