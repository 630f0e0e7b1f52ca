#!/usr/bin/env python3
"""GRPO at a real model's shape on the CPU: baton vs HF TRL, in the same run.

A randomly initialised model with Qwen2.5-0.5B's exact config (24 layers, hidden 896,
14 heads, 2 KV heads, intermediate 4864, vocabulary 151,936, tied embeddings), Qwen's
real 151,643-token tokenizer (the QwenTokenizerFixture's tokenizer.json) with
Qwen2.5-Instruct's chat template and stop tokens (generation_config.json:
<|im_end|>, <|endoftext|>), 8 GSM8K-style chat prompts x 4 samples of up to 128 new
tokens, 2 GRPO steps; baton (build/examples/grpo, 2 worker processes, one core each)
then TRL's GRPOTrainer (one process, 2 torch threads) on the same model, data and
settings. Prints one JSON object: seconds per step and per phase, tokens/s, peak RSS
per process.

    bash scripts/setup_bench.sh        # TRL, once
    ctest --test-dir build -R QwenTokenizerFixture   # the tokenizer, once
    /opt/baton-venv/bin/python bench/real_shape_bench.py [--work /tmp/real_shape] \
        [--steps 2] [--only baton|trl] [--micro-batch 4]

Settings both sides share: lr 1e-6 constant, no KL, PPO clip 0.2, one PPO epoch and one
optimizer step per generation batch (mini-batch = the 32 samples), temperature 1.0,
fp32. baton's micro-batches are --micro-batch sequences per worker (update and log-probs;
default 4: 2 was the cap while the logits existed whole; 8 runs out of 24 GiB on the
activations of two workers); TRL's
per-device batch is 8 with 4 accumulation steps (the same 32 per step). Random
weights never emit a stop token, so every response is 128 tokens on both sides.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QWEN25_05B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
    use_sliding_window=False, attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645)

QUESTIONS = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
     "in May. How many clips did Natalia sell altogether in April and May?", "72"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
     "babysitting. How much did she earn?", "10"),
    ("Betty is saving money for a new wallet which costs $100. Betty has only half of the "
     "money she needs. Her parents decided to give her $15 for that purpose, and her "
     "grandparents twice as much as her parents. How much more money does Betty need?", "5"),
    ("Julie is reading a 120-page book. Yesterday, she was able to read 12 pages and today, "
     "she read twice as many pages as yesterday. How many pages should she read tomorrow if "
     "she wants to read half of the remaining pages?", "42"),
    ("James writes a 3-page letter to 2 different friends twice a week. How many pages does "
     "he write a year?", "624"),
    ("Mark has a garden with flowers. He planted plants of three different colors in it. Ten "
     "of them are yellow, and there are 80% more of those in purple. There are only 25% as "
     "many green flowers as there are yellow and purple flowers. How many flowers does Mark "
     "have in his garden?", "35"),
    ("Albert is wondering how much pizza he can eat in one day. He buys 2 large pizzas and 2 "
     "small pizzas. A large pizza has 16 slices and a small pizza has 8 slices. If he eats it "
     "all, how many pieces does he eat that day?", "48"),
    ("Ken created a care package to send to his brother. He placed a box on a scale, and then "
     "he poured into the box enough jelly beans to bring the weight to 2 pounds. How many "
     "pounds did the box weigh at the end, if he then doubled it?", "4"),
]
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def log(*a):
    print("[real_shape_bench]", *a, file=sys.stderr, flush=True)


def make_model(work, fixture):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model_dir = os.path.join(work, "model")
    if os.path.exists(os.path.join(model_dir, "config.json")):
        return model_dir
    os.makedirs(model_dir, exist_ok=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B)).to(torch.float32)
    model.save_pretrained(model_dir, safe_serialization=True)
    shutil.copy(os.path.join(fixture, "qwen", "tokenizer.json"), model_dir)
    with open(os.path.join(fixture, "qwen", "tokenizer_config.json")) as f:
        tok_cfg = json.load(f)
    templates = os.path.join(ROOT, "build", "tests", "text", "chat_template_fixture", "templates")
    with open(os.path.join(templates, "Qwen-Qwen2.5-7B-Instruct.jinja")) as f:
        tok_cfg["chat_template"] = f.read()
    tok_cfg["eos_token"] = "<|im_end|>"
    tok_cfg["pad_token"] = "<|endoftext|>"
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=1)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643],
                   "pad_token_id": 151643}, f)
    return model_dir


def make_data(work):
    path = os.path.join(work, "train.jsonl")
    with open(path, "w") as f:
        for i, (q, a) in enumerate(QUESTIONS):
            f.write(json.dumps({
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": q + " " + INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {"index": i}}) + "\n")
    return path


class PeakRss:
    """Peak resident memory (VmHWM) of a process and its descendants, polled."""

    def __init__(self, pid):
        self.pid, self.peaks, self.names = pid, {}, {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _children(self, pid):
        # Every thread's children: the runtime spawns workers from its own thread.
        out = []
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return out
        for t in tasks:
            try:
                with open(f"/proc/{pid}/task/{t}/children") as f:
                    out.extend(int(c) for c in f.read().split())
            except OSError:
                pass
        return out

    def _run(self):
        while not self._stop:
            todo, seen = [self.pid], []
            while todo:
                p = todo.pop()
                seen.append(p)
                todo.extend(self._children(p))
            for p in seen:
                try:
                    with open(f"/proc/{p}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peaks[p] = max(self.peaks.get(p, 0), int(line.split()[1]))
                    if p not in self.names:
                        with open(f"/proc/{p}/environ", "rb") as f:
                            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                        cls = env.get(b"BATON_CLASS", b"").decode()
                        self.names[p] = f"{cls}:{env.get(b'RANK', b'').decode()}" if cls else "driver"
                except (OSError, ValueError):
                    pass
            time.sleep(0.2)

    def stop(self):
        self._stop = True
        self._thread.join()
        return {self.names.get(p, str(p)): round(kb / 1024.0, 1) for p, kb in self.peaks.items()}


def run_baton(work, model_dir, data, steps, micro):
    out = os.path.join(work, "baton_out")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [os.path.join(ROOT, "build", "examples", "grpo"), "--config",
           os.path.join(ROOT, "configs", "grpo_toy.yaml"),
           f"data.train_files=[{data}]", f"data.val_files=[{data}]",
           "data.max_prompt_length=128", "data.max_response_length=128",
           "data.train_batch_size=8", f"actor_rollout_ref.model.path={model_dir}",
           "actor_rollout_ref.actor.ppo_mini_batch_size=8",
           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
           "actor_rollout_ref.model.use_fused_kernels=true",
           "actor_rollout_ref.actor.optim.lr=1e-6",
           "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
           "actor_rollout_ref.rollout.n=4",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
           "actor_rollout_ref.rollout.kv_cache_bytes=268435456",
           f"trainer.total_training_steps={steps}", "trainer.val_before_train=false",
           "trainer.test_freq=-1", "trainer.save_freq=-1", f"trainer.default_local_dir={out}",
           "trainer.logger=[file]", "trainer.n_gpus_per_node=2", "trainer.resume_mode=disable"]
    log("baton:", " ".join(cmd))
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rss = PeakRss(proc.pid)
    text, _ = proc.communicate()
    peaks = rss.stop()
    if proc.returncode != 0:
        log(text[-4000:])
        raise SystemExit(f"baton failed ({proc.returncode})")
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    phases = {}
    for k in ("gen", "old_log_prob", "adv", "update_actor", "step"):
        phases[k] = [round(r.get(f"timing_s/{k}", 0.0), 2) for r in rows]
    resp = [r.get("response_length/mean") for r in rows]
    tokens = [r.get("response_length/mean", 0) * 32 for r in rows]
    return {"seconds_per_step": phases["step"], "phases": phases,
            "response_length_mean": resp,
            "response_tokens_per_s": [round(t / s, 1) for t, s in zip(tokens, phases["step"])],
            "peak_rss_mib": peaks, "wall_seconds_incl_startup_and_export": round(time.time() - t0, 1)}


TRL_CHILD = r'''
import json, re, sys, time
import torch
torch.set_num_threads(2)
from datasets import Dataset
import transformers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer
model_dir, data, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(data)]
ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"]} for r in rows])
tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
def reward(completions, answer, **kw):
    out = []
    for c, a in zip(completions, answer):
        text = c[0]["content"] if isinstance(c, list) else c
        m = re.findall(r"#### (\-?[0-9\.\,]+)", text[-300:])
        out.append(1.0 if m and m[-1].replace(",", "").replace("$", "") == a else 0.0)
    return out
gen_time = [0.0]
orig = transformers.GenerationMixin.generate
def timed(self, *a, **k):
    t = time.perf_counter()
    try:
        return orig(self, *a, **k)
    finally:
        gen_time[0] += time.perf_counter() - t
transformers.GenerationMixin.generate = timed
cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=8, gradient_accumulation_steps=4,
                 num_generations=4, max_completion_length=128, max_steps=steps,
                 learning_rate=1e-6, lr_scheduler_type="constant", beta=0.0, temperature=1.0,
                 epsilon=0.2, num_iterations=1, loss_type="bnpo", logging_steps=1,
                 save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=1,
                 disable_dropout=True, dataloader_num_workers=0, weight_decay=0.01,
                 max_grad_norm=1.0)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                      processing_class=tok)
step_times, last = [], [time.perf_counter()]
class Timer(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        step_times.append(now - last[0])
        last[0] = now
trainer.add_callback(Timer)
last[0] = time.perf_counter()
trainer.train()
lens = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
print(json.dumps({"seconds_per_step": [round(s, 2) for s in step_times],
                  "generate_seconds_total": round(gen_time[0], 2), "completion_length_mean": lens,
                  "trl": __import__("trl").__version__}))
'''


def run_trl(work, model_dir, data, steps):
    out = os.path.join(work, "trl_out")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", TRL_CHILD, model_dir, data, str(steps), out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rss = PeakRss(proc.pid)
    so, se = proc.communicate()
    peaks = rss.stop()
    if proc.returncode != 0:
        log(se[-4000:])
        raise SystemExit(f"TRL failed ({proc.returncode})")
    r = json.loads(so.strip().splitlines()[-1])
    lens = r.get("completion_length_mean") or [128] * steps
    r["response_tokens_per_s"] = [round(l * 32 / s, 1) for l, s in zip(lens, r["seconds_per_step"])]
    r["peak_rss_mib"] = {"trl": max(peaks.values()) if peaks else None}
    r["wall_seconds_incl_startup"] = round(time.time() - t0, 1)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/real_shape")
    ap.add_argument("--fixture", default=os.path.join(ROOT, "build", "tests", "text", "qwen_fixture"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", choices=["baton", "trl"])
    # Sequences per baton micro-batch (update and log-probs). 2 was the cap
    # while the LM head's logits existed whole; with the fused head 4 fits in
    # 24 GiB with two workers, 8 does not (the activations).
    ap.add_argument("--micro-batch", type=int, default=4)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    model_dir = make_model(a.work, a.fixture)
    data = make_data(a.work)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    result = {"bench": "real_shape_bench", "model": "Qwen2.5-0.5B shape, random init, fp32",
              "prompts": 8, "samples_per_prompt": 4, "max_new_tokens": 128, "steps": a.steps,
              "cpu": cpu, "cores": os.cpu_count(), "load_1m_before": os.getloadavg()[0]}
    if a.only != "trl":
        result["baton"] = run_baton(a.work, model_dir, data, a.steps, a.micro_batch)
        result["baton_micro_batch"] = a.micro_batch
        log("baton:", json.dumps(result["baton"]))
    if a.only != "baton":
        result["trl"] = run_trl(a.work, model_dir, data, a.steps)
        log("trl:", json.dumps(result["trl"]))
    if "baton" in result and "trl" in result:
        b = sum(result["baton"]["seconds_per_step"]) / a.steps
        t = sum(result["trl"]["seconds_per_step"]) / a.steps
        result["trl_over_baton_seconds_per_step"] = round(t / b, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
