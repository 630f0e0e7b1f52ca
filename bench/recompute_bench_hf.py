#!/usr/bin/env python3
"""recompute_bench's peer: HF transformers' gradient checkpointing at Qwen2.5-0.5B's shape.

The same measurement as bench/recompute_bench.cpp (read its header for every
field), with HF transformers' ``Qwen2ForCausalLM(Qwen2Config(...))`` (random
initialisation, fp32, CPU, sdpa attention unless --attn eager) and, for the
recompute runs, ``model.gradient_checkpointing_enable()`` (transformers 5's
default: torch.utils.checkpoint with use_reentrant=False around each decoder
layer):

    /opt/baton-venv/bin/python bench/recompute_bench_hf.py [--batch 4] [--seq 512] [--micro B]
        [--steps 3] [--threads 2] [--layers 24] [--rounds 2] [--attn sdpa|eager]
    /opt/baton-venv/bin/python bench/recompute_bench_hf.py --recompute 0|1 [same options]

Without --recompute it runs each configuration in a subprocess of its own
(this script with --recompute), off, on, on, off for 2 rounds, and prints one
JSON object as the last line of stdout, with the same fields as
recompute_bench's. Timed: forward + backward of every micro-batch, NO optimizer
step (gradients are zeroed in place between steps, outside the timing); the
first step is a warm-up. Loss: token mean of -log p (log_softmax, gather) over
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
    out = {"recompute": args.recompute == 1, "threads": torch.get_num_threads(),
           "rss_start_bytes": live_rss_bytes()}

    config = Qwen2Config(**QWEN2_5_0_5B, num_hidden_layers=args.layers,
                         rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                         use_cache=False, attention_dropout=0.0)
    config._attn_implementation = args.attn
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model = Qwen2ForCausalLM(config).float()
    out["build_s"] = time.perf_counter() - t0
    assert model.config._attn_implementation == args.attn
    model.train()
    if args.recompute:
        model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    out["rss_after_build_bytes"] = live_rss_bytes()

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
    peak_reset, steps, step_s, activation = True, [], [], 0
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
        dt = time.perf_counter() - t0
        step_peak = proc_status_bytes("VmHWM")
        peak, ru_peak = max(peak, step_peak), max(ru_peak, ru_maxrss_bytes())
        steps.append({"warmup": it == 0, "step_s": dt, "rss_before_bytes": before,
                      "peak_rss_bytes": step_peak, "activation_bytes": step_peak - before})
        if it == 0:
            out["first_loss"] = sum(x.item() for x in losses)
            del losses
            out["rss_after_first_step_bytes"] = live_rss_bytes()
        else:
            step_s.append(dt)
            activation = max(activation, step_peak - before)
    out.update(steps=steps, peak_reset=peak_reset, peak_rss_bytes=peak, ru_maxrss_bytes=ru_peak,
               activation_bytes=activation, step_s_mean=mean(step_s),
               tokens_per_s=args.batch * args.seq / mean(step_s))
    return out


def child_argv(args, recompute):
    return [sys.executable, os.path.abspath(__file__), "--recompute", str(int(recompute)),
            "--batch", str(args.batch), "--seq", str(args.seq), "--micro", str(args.micro),
            "--steps", str(args.steps), "--threads", str(args.threads),
            "--layers", str(args.layers), "--attn", args.attn, "--seed", str(args.seed)]


def run_child(args, recompute):
    """One configuration in a subprocess; its JSON (the last line of its stdout)."""
    sys.stdout.flush()
    proc = subprocess.run(child_argv(args, recompute), stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"recompute_bench_hf: the run with --recompute {int(recompute)} "
                         f"failed (exit {proc.returncode}; see above)")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(runs):
    keys = ("rss_start_bytes", "rss_after_build_bytes", "rss_after_first_step_bytes",
            "peak_rss_bytes", "ru_maxrss_bytes", "activation_bytes", "step_s_mean",
            "tokens_per_s")
    s = {k: mean([r[k] for r in runs]) for k in keys}
    s["runs"] = len(runs)
    return s


def print_run(r):
    gb = 1e9
    print(f"recompute {int(r['recompute'])}: step {r['step_s_mean']:.2f} s  peak RSS "
          f"{r['peak_rss_bytes'] / gb:.2f} GB  activations {r['activation_bytes'] / gb:.2f} GB  "
          f"after build {r['rss_after_build_bytes'] / gb:.2f} GB  after first step "
          f"{r['rss_after_first_step_bytes'] / gb:.2f} GB  (first loss {r['first_loss']:.4f})",
          flush=True)


def run_parent(args):
    import torch
    import transformers

    config = dict(QWEN2_5_0_5B, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                  num_hidden_layers=args.layers, rope_theta=ROPE_THETA, torch_dtype="float32",
                  batch=args.batch, seq=args.seq, micro_batch=args.micro, steps=args.steps)
    out = {
        "bench": "recompute_bench_hf",
        "impl": f"HF transformers Qwen2ForCausalLM, {args.attn} attention, "
                "gradient_checkpointing_enable() (use_reentrant=False)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": config,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "timed": "forward+backward of every micro-batch, no optimizer step; mean over the steps "
                 "after the first (warm-up)",
        "activation": "peak RSS during a step minus RSS just before it (max over measured steps)",
    }
    runs, by_config, order = [], {False: [], True: []}, []
    for rnd in range(args.rounds):
        for k in range(2):
            recompute = (k == 1) != (rnd % 2 == 1)
            r = run_child(args, recompute)
            print_run(r)
            order.append("recompute" if recompute else "no_recompute")
            runs.append(r)
            by_config[recompute].append(r)
    off, on = summarize(by_config[False]), summarize(by_config[True])
    out.update(order=order, runs=runs, no_recompute=off, recompute=on,
               recompute_over_no_recompute={
                   k: on[k] / off[k] for k in ("peak_rss_bytes", "activation_bytes",
                                               "step_s_mean")})
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
    args = ap.parse_args()
    args.micro = args.micro or args.batch
    if args.batch < 1 or args.seq < 2 or args.batch % args.micro:
        ap.error("--batch >= 1, --seq >= 2, and --micro must divide --batch")
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first is a warm-up)")
    if args.recompute is not None:
        print(json.dumps(run_configuration(args)))
        return
    print(f"recompute_bench_hf: Qwen2.5-0.5B shape ({args.layers} layers), batch {args.batch} x "
          f"{args.seq}, micro-batch {args.micro}, {args.steps} steps (1 warm-up), "
          f"{args.threads} threads, fp32 CPU, {args.attn}; forward+backward only", flush=True)
    out = run_parent(args)
    r = out["recompute_over_no_recompute"]
    print(f"recompute / no recompute: peak RSS {r['peak_rss_bytes']:.2f}x, activations "
          f"{r['activation_bytes']:.2f}x, step time {r['step_s_mean']:.2f}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
