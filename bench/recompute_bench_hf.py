#!/usr/bin/env python3
"""recompute_bench's peer: HF gradient checkpointing and PEFT LoRA at Qwen2.5-0.5B's shape.

The same measurement as bench/recompute_bench.cpp (read its header for every
field), with HF transformers' ``Qwen2ForCausalLM(Qwen2Config(...))`` (random
initialisation, fp32, CPU, sdpa attention unless --attn eager); for the
recompute runs ``model.gradient_checkpointing_enable()`` (transformers 5's
default: torch.utils.checkpoint with use_reentrant=False around each decoder
layer); for the LoRA runs PEFT's ``get_peft_model(model, LoraConfig(r=R,
lora_alpha=2R, target_modules="all-linear", lora_dropout=0))`` (q/k/v/o and
gate/up/down_proj of every layer; the base frozen):

    /opt/baton-venv/bin/python bench/recompute_bench_hf.py [--batch 4] [--seq 512] [--micro B]
        [--steps 3] [--threads 2] [--layers 24] [--rounds 2] [--attn sdpa|eager]
        [--lora-rank 0] [--optimizer 0|1]
    /opt/baton-venv/bin/python bench/recompute_bench_hf.py --compare lora [--lora-rank 16]
        [same options]
    /opt/baton-venv/bin/python bench/recompute_bench_hf.py --recompute 0|1 [same options]

Without --recompute it runs each of two configurations in a subprocess of its
own (this script with --recompute), A, B, B, A for 2 rounds, and prints one
JSON object as the last line of stdout, with the same fields as
recompute_bench's: --compare recompute (the default) runs no recompute and
recompute ("recompute_over_no_recompute"); --compare lora runs full
fine-tuning and LoRA of rank --lora-rank (default 16), both with the
optimizer step and without recompute ("lora_over_full"). Timed: forward +
backward of every micro-batch and, with --optimizer 1, clip_grad_norm_(1.0)
and torch.optim.AdamW (lr 1e-5, weight decay 0.01 on matrices only, as
engine::Optimizer's defaults) over the trainable parameters; gradients are
zeroed in place between steps, outside the timing; the first step is a
warm-up. torch's AdamW creates its moments in its first step, so its
optimizer_state_bytes is read after the first step and rss_after_optimizer
equals rss_after_build (baton's Optimizer allocates them when built); compare
rss_after_first_step. Loss: token mean of -log p (log_softmax, gather) over
all B*(S-1) next-token positions, as recompute_bench's. Memory is read as
recompute_bench reads it (VmRSS after malloc_trim(0), VmHWM reset through
/proc/self/clear_refs before each step, ru_maxrss); rss_start_bytes holds
what the interpreter, torch and transformers take before the model exists.
"""
import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time

# Qwen2.5-0.5B's config.json (see recompute_bench.cpp), less the layer count.
QWEN2_5_0_5B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_attention_heads=14, num_key_value_heads=2, head_dim=64,
                    max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    use_sliding_window=False, hidden_act="silu")
ROPE_THETA = 1000000.0
COMPARE_LORA_RANK = 16  # --compare lora without --lora-rank

_libc = ctypes.CDLL("libc.so.6")


def proc_status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def ru_maxrss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def live_rss_bytes():
    """VmRSS after glibc hands back the free()d pages it keeps."""
    _libc.malloc_trim(0)
    return proc_status_bytes("VmRSS")


def reset_peak_rss():
    """Resets VmHWM (and ru_maxrss) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def mean(xs):
    return sum(xs) / len(xs)


def run_configuration(args):
    """One configuration in this process; returns its JSON object."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(args.threads)
    lora_rank = args.lora_rank or 0
    out = {"recompute": args.recompute == 1, "lora_rank": lora_rank,
           "optimizer": args.optimizer == 1, "threads": torch.get_num_threads(),
           "rss_start_bytes": live_rss_bytes()}

    config = Qwen2Config(**QWEN2_5_0_5B, num_hidden_layers=args.layers,
                         rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                         use_cache=False, attention_dropout=0.0)
    config._attn_implementation = args.attn
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = Qwen2ForCausalLM(config).float()
    assert model.config._attn_implementation == args.attn
    model.train()
    if args.recompute:
        model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing
    if lora_rank:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank,
                                                 target_modules="all-linear", lora_dropout=0.0))
        model.train()
    out["build_s"] = time.perf_counter() - t0
    out["param_bytes"] = sum(p.numel() * p.element_size()
                             for n, p in model.named_parameters() if "lora_" not in n)
    trainable = [p for p in model.parameters() if p.requires_grad]
    out["trainable_params"] = sum(p.numel() for p in trainable)
    out["trainable_bytes"] = sum(p.numel() * p.element_size() for p in trainable)
    out["rss_after_build_bytes"] = live_rss_bytes()

    opt = None
    if args.optimizer:
        # engine::Optimizer's defaults: no weight decay on 1-D parameters.
        groups = [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": 0.01},
                  {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-5, betas=(0.9, 0.999),
                                eps=1e-8)
    out["rss_after_optimizer_bytes"] = live_rss_bytes()

    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=g)
    pos = torch.arange(args.seq).unsqueeze(0).expand(args.batch, -1).contiguous()
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    mbs = [(ids[r:r + args.micro], pos[r:r + args.micro], mask[r:r + args.micro])
           for r in range(0, args.batch, args.micro)]
    positions = args.batch * (args.seq - 1)

    def micro_batch_loss(mb):
        i, p, m = mb
        logits = model(input_ids=i, attention_mask=m, position_ids=p, use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        return -lp.gather(-1, i[:, 1:].unsqueeze(-1)).squeeze(-1).sum() / positions

    peak, ru_peak = proc_status_bytes("VmHWM"), ru_maxrss_bytes()
    peak_reset, steps, step_s, optimizer_s, activation = True, [], [], [], 0
    for it in range(args.steps):
        model.zero_grad(set_to_none=False)
        before = live_rss_bytes()
        peak_reset = reset_peak_rss() and peak_reset
        t0 = time.perf_counter()
        losses = []
        for mb in mbs:
            loss = micro_batch_loss(mb)
            loss.backward()
            losses.append(loss.detach())
            del loss
        t_opt = time.perf_counter()
        if opt is not None:
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
        t_end = time.perf_counter()
        dt, opt_dt = t_end - t0, (t_end - t_opt if opt is not None else 0.0)
        step_peak = proc_status_bytes("VmHWM")
        peak, ru_peak = max(peak, step_peak), max(ru_peak, ru_maxrss_bytes())
        steps.append({"warmup": it == 0, "step_s": dt, "optimizer_s": opt_dt,
                      "rss_before_bytes": before, "peak_rss_bytes": step_peak,
                      "activation_bytes": step_peak - before})
        if it == 0:
            out["first_loss"] = sum(x.item() for x in losses)
            del losses
            out["grad_bytes"] = sum(p.grad.numel() * p.grad.element_size()
                                    for p in model.parameters() if p.grad is not None)
            out["optimizer_state_bytes"] = 0 if opt is None else sum(
                t.numel() * t.element_size() for st in opt.state.values()
                for k, t in st.items() if k in ("exp_avg", "exp_avg_sq"))
            out["rss_after_first_step_bytes"] = live_rss_bytes()
        else:
            step_s.append(dt)
            optimizer_s.append(opt_dt)
            activation = max(activation, step_peak - before)
    out.update(steps=steps, peak_reset=peak_reset, peak_rss_bytes=peak, ru_maxrss_bytes=ru_peak,
               activation_bytes=activation, step_s_mean=mean(step_s),
               optimizer_s_mean=mean(optimizer_s),
               tokens_per_s=args.batch * args.seq / mean(step_s))
    return out


def child_argv(args, variant):
    return [sys.executable, os.path.abspath(__file__),
            "--recompute", str(int(variant["recompute"])),
            "--lora-rank", str(variant["lora_rank"]),
            "--optimizer", str(int(variant["optimizer"])),
            "--batch", str(args.batch), "--seq", str(args.seq), "--micro", str(args.micro),
            "--steps", str(args.steps), "--threads", str(args.threads),
            "--layers", str(args.layers), "--attn", args.attn, "--seed", str(args.seed)]


def run_child(args, variant):
    """One configuration in a subprocess; its JSON (the last line of its stdout)."""
    sys.stdout.flush()
    proc = subprocess.run(child_argv(args, variant), stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"recompute_bench_hf: the {variant['name']} run failed "
                         f"(exit {proc.returncode}; see above)")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(runs):
    keys = ("rss_start_bytes", "rss_after_build_bytes", "rss_after_optimizer_bytes",
            "rss_after_first_step_bytes", "peak_rss_bytes", "ru_maxrss_bytes", "activation_bytes",
            "step_s_mean", "optimizer_s_mean", "tokens_per_s", "trainable_params",
            "trainable_bytes", "optimizer_state_bytes", "grad_bytes")
    s = {k: mean([r[k] for r in runs]) for k in keys}
    s["runs"] = len(runs)
    return s


def print_run(variant, r):
    gb = 1e9
    print(f"{variant['label']}: step {r['step_s_mean']:.2f} s  peak RSS "
          f"{r['peak_rss_bytes'] / gb:.2f} GB  activations {r['activation_bytes'] / gb:.2f} GB  "
          f"after build {r['rss_after_build_bytes'] / gb:.2f} GB  after first step "
          f"{r['rss_after_first_step_bytes'] / gb:.2f} GB  trainable {r['trainable_params']} "
          f"params  (first loss {r['first_loss']:.4f})", flush=True)


def make_variant(name, label, recompute, lora_rank, optimizer):
    return dict(name=name, label=label, recompute=recompute, lora_rank=lora_rank,
                optimizer=optimizer)


def comparison(args):
    """The parent's two configurations (A, B), the key of B / A and its fields."""
    if args.compare == "lora":
        rank = COMPARE_LORA_RANK if args.lora_rank is None else args.lora_rank
        return (make_variant("full", "full", False, 0, True),
                make_variant("lora", f"lora rank {rank}", False, rank, True), "lora_over_full",
                ("peak_rss_bytes", "rss_after_first_step_bytes", "activation_bytes",
                 "step_s_mean", "trainable_params", "trainable_bytes"))
    rank, optimizer = args.lora_rank or 0, args.optimizer == 1
    return (make_variant("no_recompute", "recompute 0", False, rank, optimizer),
            make_variant("recompute", "recompute 1", True, rank, optimizer),
            "recompute_over_no_recompute", ("peak_rss_bytes", "activation_bytes", "step_s_mean"))


def run_parent(args, a, b, ratio_key, ratios):
    import torch
    import transformers

    config = dict(QWEN2_5_0_5B, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                  num_hidden_layers=args.layers, rope_theta=ROPE_THETA, torch_dtype="float32",
                  batch=args.batch, seq=args.seq, micro_batch=args.micro, steps=args.steps,
                  lora_rank=b["lora_rank"], optimizer=b["optimizer"])
    if ratio_key == "lora_over_full":
        impl = (f"HF transformers Qwen2ForCausalLM, {args.attn} attention, PEFT LoraConfig("
                "target_modules='all-linear', lora_alpha=2r) against full fine-tuning, "
                "torch.optim.AdamW")
    else:
        impl = (f"HF transformers Qwen2ForCausalLM, {args.attn} attention, "
                "gradient_checkpointing_enable() (use_reentrant=False)")
    timed = ("forward+backward of every micro-batch, then clip_grad_norm_ and one AdamW step"
             if b["optimizer"] else "forward+backward of every micro-batch, no optimizer step")
    out = {
        "bench": "recompute_bench_hf",
        "impl": impl,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": config,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "timed": timed + "; mean over the steps after the first (warm-up)",
        "activation": "peak RSS during a step minus RSS just before it (max over measured steps)",
    }
    if a["lora_rank"] or b["lora_rank"]:
        import peft
        out["peft"] = peft.__version__
    runs, of_a, of_b, order = [], [], [], []
    for rnd in range(args.rounds):
        for k in range(2):
            second = (k == 1) != (rnd % 2 == 1)
            v = b if second else a
            r = run_child(args, v)
            print_run(v, r)
            order.append(v["name"])
            runs.append(r)
            (of_b if second else of_a).append(r)
    s_a, s_b = summarize(of_a), summarize(of_b)
    out.update(order=order, runs=runs)
    out[a["name"]], out[b["name"]] = s_a, s_b
    out[ratio_key] = {k: s_b[k] / s_a[k] for k in ratios}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recompute", type=int, choices=[0, 1],
                    help="run this configuration in this process (default: both, in children)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--micro", type=int, default=0, help="sequences per micro-batch (0: batch)")
    ap.add_argument("--steps", type=int, default=3, help="steps per run, the first a warm-up")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads")
    ap.add_argument("--layers", type=int, default=24, help="decoder layers (smaller: smoke run)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (off, on) / (on, off)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa",
                    help="HF's attention implementation")
    ap.add_argument("--seed", type=int, default=1234, help="parameters and tokens")
    ap.add_argument("--compare", choices=["recompute", "lora"],
                    help="the parent's two configurations (default: recompute)")
    ap.add_argument("--lora-rank", type=int,
                    help=f"LoRA rank, 0: full fine-tuning (default 0; {COMPARE_LORA_RANK} "
                         "with --compare lora)")
    ap.add_argument("--optimizer", type=int, choices=[0, 1], default=0,
                    help="an AdamW step after each backward (--compare lora: always)")
    args = ap.parse_args()
    args.micro = args.micro or args.batch
    if args.batch < 1 or args.seq < 2 or args.batch % args.micro:
        ap.error("--batch >= 1, --seq >= 2, and --micro must divide --batch")
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first is a warm-up)")
    if args.recompute is not None and args.compare is not None:
        ap.error("--compare is the parent's; a --recompute run is one")
    if args.lora_rank is not None and args.lora_rank < 0:
        ap.error("--lora-rank must be >= 0")
    if args.compare == "lora" and args.lora_rank == 0:
        ap.error("--compare lora needs --lora-rank > 0")
    if args.recompute is not None:
        print(json.dumps(run_configuration(args)))
        return
    a, b, ratio_key, ratios = comparison(args)
    print(f"recompute_bench_hf: Qwen2.5-0.5B shape ({args.layers} layers), batch {args.batch} x "
          f"{args.seq}, micro-batch {args.micro}, {args.steps} steps (1 warm-up), "
          f"{args.threads} threads, fp32 CPU, {args.attn}; {a['name']} vs {b['name']} (LoRA "
          f"rank {b['lora_rank']}), "
          f"{'forward+backward+AdamW' if b['optimizer'] else 'forward+backward only'}",
          flush=True)
    out = run_parent(args, a, b, ratio_key, ratios)
    r = out[ratio_key]
    line = (f"{b['name']} / {a['name']}: peak RSS {r['peak_rss_bytes']:.2f}x, activations "
            f"{r['activation_bytes']:.2f}x, step time {r['step_s_mean']:.2f}x")
    if "trainable_params" in r:
        line += (f", after the first step {r['rss_after_first_step_bytes']:.2f}x, trainable "
                 f"parameters {r['trainable_params']:.4f}x")
    print(line)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
