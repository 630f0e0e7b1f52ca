#!/usr/bin/env python3
"""scripts/gpu_bench.sh's Python side: the benchmark's steps and its JSON.

    python3 scripts/gpu_bench.py run --device cuda|cpu [--smoke] --out DIR --build-dir DIR \
        [--build-status S] [--deadline EPOCH_S] [--models a,b] ...

`run` runs every step as a subprocess with a time limit (its log in
DIR/<step>.txt), records each step's status, and prints one JSON object (also
DIR/gpu_bench.json); a step that fails or times out is recorded, never fatal.
The subprocesses are this file's other commands and baton's binaries:

    probe           device name, memory, device-to-device copy bandwidth
    checkpoint      a random-init checkpoint of one SHAPES entry (+ tokenizer)
    hf-decode       HF transformers' generate on rollout_bench's inputs
    trl-grpo        one TRL GRPOTrainer run (bench/trl_grpo_toy.py's pieces)

What every key means: docs/gpu.md, "Benchmark".
"""
import argparse
import datetime
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

# The models' configs (config.json keys), as their HF releases have them;
# the weights are random (speed does not depend on their values).
SHAPES = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False),
    "qwen3-1.7b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
        use_sliding_window=False),
}
# SMOKE: the same families at a size a CPU runs in seconds.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
SPECIAL = ["<pad>", "<eos>", "<unk>"]  # ids 0, 1, 2; then one word "w<id>" per id

# Sizes: the benchmark's, and SMOKE's.
FULL = dict(batches=[1, 16, 64, 256], prompt=512, new=512, grpo_prompts=8, grpo_n=8,
            grpo_prompt=32, grpo_response=512, grpo_steps=2, grpo_micro=8)
SMALL = dict(batches=[1, 16, 64, 256], prompt=8, new=2, grpo_prompts=8, grpo_n=8,
             grpo_prompt=8, grpo_response=2, grpo_steps=1, grpo_micro=8)


def log(*a):
    print("[gpu_bench]", *a, file=sys.stderr, flush=True)


def json_lines(path):
    """Every line of a log that is a JSON object."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{") and line.endswith("}"):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except OSError:
        pass
    return out


def shape_config(name, smoke):
    cfg = dict(SHAPES[name])
    if smoke:
        cfg.update(TINY)
        if "head_dim" in cfg:
            cfg["head_dim"] = 32
    cfg.update(bos_token_id=None, eos_token_id=1, pad_token_id=0)
    return cfg


def weight_facts(cfg, dtype_bytes):
    """Parameters (tied embeddings once), their bytes, KV bytes per token."""
    h, v, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    attn = h * q + 2 * h * kv + q * h
    if cfg["model_type"] == "qwen2":
        attn += q + 2 * kv  # q/k/v biases
    else:
        attn += 2 * hd  # q_norm, k_norm
    layer = attn + 3 * h * cfg["intermediate_size"] + 2 * h
    params = v * h * (1 if cfg["tie_word_embeddings"] else 2) + L * layer + h
    return {"params": params, "weight_bytes": params * dtype_bytes,
            "kv_bytes_per_token": 2 * L * kv * dtype_bytes}


# ---------------------------------------------------------------- subcommands


def cmd_probe(a):
    import torch

    dev = torch.device(a.device)
    info = {"torch": torch.__version__}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, count=torch.cuda.device_count())
    else:
        name = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                     if l.startswith("model name")), "cpu")
        mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
        info.update(name=name, memory_gib=round(mem / 2**20, 1), cores=os.cpu_count())
    n = a.copy_mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dst.copy_(src)
    sync()
    t = time.perf_counter()
    for _ in range(a.copy_iters):
        dst.copy_(src)
    sync()
    dt = time.perf_counter() - t
    info["copy_bytes"] = n
    info["copy_bandwidth_gb_s"] = round(2 * n * a.copy_iters / dt / 1e9, 1)  # read + write
    print(json.dumps(info))


def tokenizer_files(vocab_size):
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), vocab_size)})
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIAL)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
           "decoder": None,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<eos>",
           "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": False,
           "add_eos_token": False, "model_max_length": 65536}
    return tok, cfg


def cmd_checkpoint(a):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = shape_config(a.shape, a.smoke)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(a.dir)
    tok, tok_cfg = tokenizer_files(cfg["vocab_size"])
    for name, obj in (("tokenizer.json", tok), ("tokenizer_config.json", tok_cfg),
                      ("generation_config.json",
                       {"bos_token_id": None, "eos_token_id": 1, "pad_token_id": 0})):
        with open(os.path.join(a.dir, name), "w") as f:
            json.dump(obj, f)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"shape": a.shape, "model_type": model_type, "dir": a.dir, "params": params,
                      "dtype": "bf16", "seconds": round(time.perf_counter() - t, 1)}))


def peak_host_mib():
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def cmd_hf_decode(a):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.set_num_threads(os.cpu_count())
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(dev).eval()
    vocab = model.config.vocab_size
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def generate(ids, new):
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                  do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, **kw)
        sync()
        assert out.shape == (ids.shape[0], ids.shape[1] + new), out.shape
        return time.perf_counter() - t

    rows = []
    for b in a.batches:
        # rollout_bench's prompts: randint(3, vocab) from a CPU generator seeded 42 + B.
        gen = torch.Generator().manual_seed(42 + b)
        ids = torch.randint(3, vocab, (b, a.prompt), generator=gen).to(dev)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        generate(ids, min(a.new, 4))  # warm-up
        t_first = generate(ids, 1)  # prefill and one token
        t_all = generate(ids, a.new)
        row = {"batch": b, "hf_generate_tokens_per_s": b * a.new / t_all,
               "hf_decode_tokens_per_s": (b * (a.new - 1) / (t_all - t_first)
                                          if a.new > 1 and t_all > t_first else None),
               "hf_prefill_seconds": t_first}
        if cuda:
            row["hf_max_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        else:
            row["hf_peak_rss_mib"] = peak_host_mib()
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(json.dumps({"bench": "hf_decode", "transformers": transformers.__version__,
                      "torch": torch.__version__, "dtype": a.dtype, "results": rows}))


def cmd_trl_grpo(a):
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_grpo_toy import gsm8k_strict_score, load_tokenizer, read_rows

    cuda = a.device == "cuda"
    torch.set_num_threads(os.cpu_count())
    rows = read_rows(a.data)
    tok = load_tokenizer(a.model)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id

    def reward(prompts, completions, ground_truth, **kw):
        return [gsm8k_strict_score(c, g) for c, g in zip(completions, ground_truth)]

    samples = a.prompts * a.n
    # One generation batch of prompts x n, one optimizer step over it in
    # micro-batches of --micro (baton: ppo_mini_batch_size = the prompts).
    config = GRPOConfig(
        output_dir=os.path.join(a.work, "trl_out"), use_cpu=not cuda, seed=1,
        max_steps=a.steps, per_device_train_batch_size=a.micro,
        gradient_accumulation_steps=samples // a.micro, num_iterations=1, num_generations=a.n,
        max_completion_length=a.response, temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        epsilon=0.2, loss_type="bnpo", learning_rate=1e-6, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0, bf16=a.dtype == "bf16",
        fp16=False, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False)
    clock = {"gen": 0.0}

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                clock["gen"] += time.perf_counter() - t0

    steps = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, *args, **kw):
            self.t, self.gen = time.perf_counter(), 0.0

        def on_step_end(self, *args, **kw):
            now = time.perf_counter()
            steps.append({"seconds": now - self.t, "gen": clock["gen"] - self.gen})
            print(json.dumps({"trl_step": len(steps), **steps[-1]}), file=sys.stderr, flush=True)
            self.t, self.gen = now, clock["gen"]

    real_stdout, sys.stdout = sys.stdout, sys.stderr  # Trainer prints its logs on stdout
    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=config,
                               train_dataset=Dataset.from_list(rows), processing_class=tok,
                               callbacks=[StepClock()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    sys.stdout = real_stdout
    lens = [h["completions/mean_length"] for h in trainer.state.log_history
            if "completions/mean_length" in h]
    out = {"bench": "trl_grpo", "trl": __import__("trl").__version__,
           "transformers": transformers.__version__, "torch": torch.__version__,
           "step_seconds": [round(s["seconds"], 3) for s in steps],
           "gen_seconds": [round(s["gen"], 3) for s in steps],
           "response_length_mean": lens}
    if cuda:
        out["max_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    else:
        out["peak_rss_mib"] = peak_host_mib()
    print(json.dumps(out))


# ---------------------------------------------------------------- the run


class GpuMemory:
    """Peak nvidia-smi memory.used of GPU 0 while a step runs, sampled every 250 ms."""

    def __init__(self):
        self.samples = []
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "-lms", "250"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def stop(self):
        if self.proc is None:
            return None
        time.sleep(0.3)
        self.proc.terminate()
        self.proc.wait()
        self.thread.join(timeout=2)
        if not self.samples:
            return None
        return {"peak_mib": max(self.samples), "before_mib": self.samples[0],
                "peak_over_before_mib": max(self.samples) - self.samples[0]}


class Runner:
    def __init__(self, a):
        self.a, self.steps, self.memory = a, {}, {}
        self.cuda = a.device == "cuda"

    def left(self):
        return self.a.deadline - time.time()

    def run(self, name, cmd, cap_s, env=None):
        """Runs one step; returns its log path, or None when it was skipped."""
        logp = os.path.join(self.a.out, name + ".txt")
        limit = min(cap_s, self.a.step_cap, self.left())
        if self.left() < 10:
            self.steps[name] = {"status": "skipped (time budget spent)", "log": None}
            log(name, "skipped: time budget spent")
            return None
        log(name, f"(limit {limit:.0f} s):", " ".join(cmd))
        t0 = time.time()
        gpu = GpuMemory() if self.cuda else None
        with open(logp, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, cwd=ROOT)
            rss = None
            if not self.cuda:
                from real_shape_bench import PeakRss
                rss = PeakRss(proc.pid)
            try:
                rc = proc.wait(timeout=limit)
                status = "ok" if rc == 0 else f"failed (rc {rc})"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the step's own process group
                proc.wait()
                status = f"timeout ({limit:.0f} s)"
        seconds = round(time.time() - t0, 1)
        self.steps[name] = {"status": status, "seconds": seconds, "log": logp}
        if gpu is not None:
            self.memory[name] = gpu.stop()
        if rss is not None:
            peaks = rss.stop()
            self.memory[name] = {"peak_rss_mib_sum": round(sum(peaks.values()), 1),
                                 "peak_rss_mib_max": max(peaks.values(), default=None)}
        log(name, status, f"{seconds} s")
        if status != "ok":
            try:
                with open(logp, errors="replace") as f:
                    tail = f.read()[-1500:]
                log(name, "log tail:\n" + tail)
            except OSError:
                pass
        return logp


def me(*args):
    return [sys.executable, os.path.abspath(__file__), *args]


def grpo_data(path, prompts, prompt_tokens, vocab):
    import random

    rng = random.Random(7)
    with open(path, "w") as f:
        for i in range(prompts):
            words = " ".join(f"w{rng.randrange(len(SPECIAL), vocab)}" for _ in range(prompt_tokens))
            f.write(json.dumps({"data_source": "openai/gsm8k", "prompt": words, "ability": "math",
                                "reward_model": {"style": "rule", "ground_truth": "42"},
                                "extra_info": {"index": i}}) + "\n")


def decode_rows(facts, copy_gb_s, baton_log, hf_log, z):
    """One row per batch: baton's and HF's rates, their ratio, the bandwidth bound."""
    baton = {r["batch"]: r for r in json_lines(baton_log) if "batch" in r} if baton_log else {}
    hf = {r["batch"]: r for r in json_lines(hf_log) if "batch" in r} if hf_log else {}
    rows = []
    for b in z["batches"]:
        row = {"batch": b}
        if b in baton:
            row["baton_decode_tokens_per_s"] = round(baton[b]["decode_tokens_per_s"], 1)
            row["baton_generate_tokens_per_s"] = round(baton[b]["cached_tokens_per_s"], 1)
            row["baton_preemptions"] = baton[b].get("preemptions")
        if b in hf:
            row["hf_decode_tokens_per_s"] = (round(hf[b]["hf_decode_tokens_per_s"], 1)
                                             if hf[b]["hf_decode_tokens_per_s"] else None)
            row["hf_generate_tokens_per_s"] = round(hf[b]["hf_generate_tokens_per_s"], 1)
            for k in ("hf_max_memory_allocated_mib", "hf_peak_rss_mib"):
                if k in hf[b]:
                    row[k] = hf[b][k]
        for what in ("decode", "generate"):
            x, y = row.get(f"baton_{what}_tokens_per_s"), row.get(f"hf_{what}_tokens_per_s")
            if x and y:
                row[f"baton_over_hf_{what}"] = round(x / y, 3)
        if facts and copy_gb_s:
            # One decode step reads every weight once and each sequence's KV
            # cache, on average prompt + new / 2 positions long.
            step_bytes = facts["weight_bytes"] + b * (z["prompt"] + z["new"] / 2) * facts["kv_bytes_per_token"]
            row["bound_tokens_per_s"] = round(b * copy_gb_s * 1e9 / step_bytes, 1)
            for who in ("baton", "hf"):
                x = row.get(f"{who}_decode_tokens_per_s")
                if x:
                    row[f"{who}_fraction_of_bound"] = round(x / row["bound_tokens_per_s"], 4)
        rows.append(row)
    return rows


def grpo_summary_baton(out_dir, z):
    try:
        rows = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl")) if l.strip()]
    except OSError:
        return None
    rows = [r for r in rows if "timing_s/step" in r]
    if not rows:
        return None
    step = [round(r["timing_s/step"], 3) for r in rows]
    return {"step_seconds": step,
            "seconds_per_step": step[-1] if len(step) == 1 else round(sum(step[1:]) / (len(step) - 1), 3),
            "phases_last_step": {k[len("timing_s/"):]: round(v, 3) for k, v in rows[-1].items()
                                 if k.startswith("timing_s/")},
            "response_length_mean": [r.get("response_length/mean") for r in rows]}


def cmd_run(a):
    t_start = time.time()
    z = dict(SMALL if a.smoke else FULL)
    if a.batches:
        z["batches"] = [int(x) for x in a.batches.split(",")]
    for k in ("prompt", "new", "grpo_steps"):
        if getattr(a, k) is not None:
            z[k] = getattr(a, k)
    os.makedirs(a.out, exist_ok=True)
    work = os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in SHAPES:
            sys.exit(f"gpu_bench: unknown model {m} (known: {', '.join(SHAPES)})")
    dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    dtype_bytes = 2 if dtype == "bf16" else 4
    R = Runner(a)
    bin_dir = os.path.abspath(os.path.join(ROOT, a.build_dir))
    rollout_bench = os.path.join(bin_dir, "bench", "rollout_bench")
    grpo = os.path.join(bin_dir, "examples", "grpo")
    result = {"bench": "gpu_bench", "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%MZ"),
              "device_kind": a.device, "smoke": a.smoke, "dtype": dtype,
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                       capture_output=True, text=True).stdout.strip() or None,
              "settings": {"batches": z["batches"], "prompt_tokens": z["prompt"],
                           "new_tokens": z["new"], "models": models}}
    R.steps["build"] = {"status": a.build_status, "log": a.build_log}

    # 1. The device, and its copy bandwidth first.
    copy_mib = 1024 if a.device == "cuda" else (64 if a.smoke else 512)
    logp = R.run("probe", me("probe", "--device", a.device, "--copy-mib", str(copy_mib),
                             "--copy-iters", "20" if a.device == "cuda" else "3"), 120)
    probe = (json_lines(logp) or [{}])[-1] if logp else {}
    result["device"] = probe
    copy_gb_s = probe.get("copy_bandwidth_gb_s")

    # 2-3. Per model: its checkpoint, then baton's and HF's decode; the GRPO
    # comparison after the first model (the time budget may cut later models).
    result["checkpoints"], result["decode"] = {}, {}
    for i, m in enumerate(models):
        ckpt = os.path.join(work, m)
        cfg = shape_config(m, a.smoke)
        facts = weight_facts(cfg, dtype_bytes)
        logp = R.run(f"checkpoint_{m}", me("checkpoint", "--shape", m, "--dir", ckpt,
                                           "--device", a.device) + (["--smoke"] if a.smoke else []),
                     240)
        made = R.steps[f"checkpoint_{m}"]["status"] == "ok"
        written = (json_lines(logp) or [{}])[-1] if logp else {}
        result["checkpoints"][m] = dict(facts, model_type=cfg["model_type"],
                                        dir=ckpt if made else None,
                                        params_written=written.get("params"),
                                        seconds=written.get("seconds"))
        batches = ",".join(str(b) for b in z["batches"])
        baton_log = hf_log = None
        if made:
            baton_log = R.run(f"decode_baton_{m}", [
                rollout_bench, "--model", ckpt, "--device", a.device, "--dtype", dtype,
                "--batches", batches, "--prompt", str(z["prompt"]), "--new", str(z["new"]),
                "--repeats", "1", "--cached-only", "--cache-mb", "0",
                "--warmup-new", str(min(z["new"], 4))], a.step_cap)
            hf_log = R.run(f"decode_hf_{m}", me("hf-decode", "--model", ckpt, "--device", a.device,
                                                "--dtype", dtype, "--batches", batches,
                                                "--prompt", str(z["prompt"]), "--new", str(z["new"])),
                           a.step_cap)
        result["decode"][m] = decode_rows(facts, copy_gb_s, baton_log, hf_log, z)
        if i == 0:
            result["grpo"] = grpo_step(R, a, z, m, ckpt if made else None, cfg, dtype, grpo, work)

    result["peak_memory_kind"] = (
        "GPU MiB: nvidia-smi memory.used of GPU 0 sampled every 250 ms during the step "
        "(peak, and peak over the reading before it started); the Python peers also report "
        "torch.cuda.max_memory_allocated in their own rows" if a.device == "cuda" else
        "CPU, not GPU: peak RSS (VmHWM) in MiB of the step's processes, summed and largest")
    result["peak_memory"] = R.memory
    result["steps"] = R.steps
    result["seconds"] = round(time.time() - a.t0 if a.t0 else time.time() - t_start, 1)
    text = json.dumps(result, indent=1)
    with open(os.path.join(a.out, "gpu_bench.json"), "w") as f:
        f.write(text + "\n")
    print(text)


def grpo_step(R, a, z, m, ckpt, cfg, dtype, grpo, work):
    """4. One GRPO configuration, baton then TRL."""
    g = {"model": m, "prompts": z["grpo_prompts"], "samples_per_prompt": z["grpo_n"],
         "prompt_tokens": z["grpo_prompt"], "response_tokens": z["grpo_response"],
         "steps": z["grpo_steps"], "micro_batch": z["grpo_micro"], "dtype": dtype}
    if ckpt is None:
        R.steps["grpo_baton"] = R.steps["grpo_trl"] = {"status": "skipped (no checkpoint)",
                                                       "log": None}
        return g
    data = os.path.join(work, "grpo_train.jsonl")
    grpo_data(data, z["grpo_prompts"], z["grpo_prompt"], cfg["vocab_size"])
    out_dir = os.path.join(work, "grpo_baton")
    facts = weight_facts(cfg, 2 if dtype == "bf16" else 4)
    seqs = z["grpo_prompts"] * z["grpo_n"]
    kv_bytes = max(64 << 20, 2 * seqs * (z["grpo_prompt"] + z["grpo_response"] + 32)
                   * facts["kv_bytes_per_token"])
    cmd = [grpo, "--config", os.path.join(ROOT, "configs", "grpo_toy.yaml"),
           f"data.train_files=[{data}]", f"data.val_files=[{data}]",
           f"data.max_prompt_length={z['grpo_prompt'] + 8}",
           f"data.max_response_length={z['grpo_response']}",
           f"data.train_batch_size={z['grpo_prompts']}", f"actor_rollout_ref.model.path={ckpt}",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={z['grpo_prompts']}",
           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={z['grpo_micro']}",
           "actor_rollout_ref.actor.optim.lr=1e-6",
           "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
           f"actor_rollout_ref.actor.megatron.dtype={'bfloat16' if dtype == 'bf16' else 'float32'}",
           f"actor_rollout_ref.rollout.n={z['grpo_n']}",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={z['grpo_micro']}",
           f"actor_rollout_ref.rollout.kv_cache_bytes={kv_bytes}",
           f"trainer.total_training_steps={z['grpo_steps']}", "trainer.val_before_train=false",
           "trainer.test_freq=-1", "trainer.save_freq=-1", f"trainer.default_local_dir={out_dir}",
           "trainer.logger=[file]", "trainer.n_gpus_per_node=1", f"trainer.device={a.device}",
           "trainer.resume_mode=disable"]
    R.run("grpo_baton", cmd, a.step_cap)
    g["baton"] = grpo_summary_baton(out_dir, z)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    logp = R.run("grpo_trl", me("trl-grpo", "--model", ckpt, "--data", data, "--work", work,
                                "--device", a.device, "--dtype", dtype,
                                "--prompts", str(z["grpo_prompts"]), "--n", str(z["grpo_n"]),
                                "--response", str(z["grpo_response"]),
                                "--steps", str(z["grpo_steps"]), "--micro", str(z["grpo_micro"])),
                 a.step_cap, env=env)
    trl = next((r for r in reversed(json_lines(logp)) if r.get("bench") == "trl_grpo"), None) if logp else None
    if trl is None and logp:  # cut short: the steps it finished
        done = [r for r in json_lines(logp) if "trl_step" in r]
        trl = {"step_seconds": [round(r["seconds"], 3) for r in done]} if done else None
    if trl and trl.get("step_seconds"):
        s = trl["step_seconds"]
        trl["seconds_per_step"] = s[-1] if len(s) == 1 else round(sum(s[1:]) / (len(s) - 1), 3)
    g["trl"] = trl
    if g.get("baton") and trl and trl.get("seconds_per_step"):
        g["trl_over_baton_seconds_per_step"] = round(
            trl["seconds_per_step"] / g["baton"]["seconds_per_step"], 3)
    return g


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--smoke", action="store_true")
    r.add_argument("--out", required=True)
    r.add_argument("--build-dir", default="build-gpu")
    r.add_argument("--build-status", default="not run")
    r.add_argument("--build-log", default=None)
    r.add_argument("--deadline", type=float, default=time.time() + 420)
    r.add_argument("--t0", type=float, default=None, help="the whole script's start (epoch s)")
    r.add_argument("--step-cap", type=float, default=150)
    r.add_argument("--models", default=",".join(SHAPES))
    r.add_argument("--dtype", choices=["bf16", "fp32"], default=None)
    r.add_argument("--batches", default=None)
    r.add_argument("--prompt", type=int, default=None)
    r.add_argument("--new", type=int, default=None)
    r.add_argument("--grpo-steps", type=int, default=None)
    q = sub.add_parser("probe")
    q.add_argument("--device", default="cuda")
    q.add_argument("--copy-mib", type=int, default=1024)
    q.add_argument("--copy-iters", type=int, default=20)
    c = sub.add_parser("checkpoint")
    c.add_argument("--shape", required=True, choices=list(SHAPES))
    c.add_argument("--dir", required=True)
    c.add_argument("--device", default="cpu")
    c.add_argument("--smoke", action="store_true")
    h = sub.add_parser("hf-decode")
    h.add_argument("--model", required=True)
    h.add_argument("--device", default="cuda")
    h.add_argument("--dtype", default="bf16")
    h.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], required=True)
    h.add_argument("--prompt", type=int, required=True)
    h.add_argument("--new", type=int, required=True)
    t = sub.add_parser("trl-grpo")
    for k in ("--model", "--data", "--work"):
        t.add_argument(k, required=True)
    t.add_argument("--device", default="cuda")
    t.add_argument("--dtype", default="bf16")
    for k in ("--prompts", "--n", "--response", "--steps", "--micro"):
        t.add_argument(k, type=int, required=True)
    a = p.parse_args()
    {"run": cmd_run, "probe": cmd_probe, "checkpoint": cmd_checkpoint, "hf-decode": cmd_hf_decode,
     "trl-grpo": cmd_trl_grpo}[a.cmd](a)


if __name__ == "__main__":
    main()
