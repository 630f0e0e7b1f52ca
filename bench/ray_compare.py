#!/usr/bin/env python3
"""baton's runtime_bench and dispatch_bench next to Ray running the same
workloads, in one run.

    bash scripts/setup_bench.sh          # Ray into the venv (once)
    /opt/baton-venv/bin/python bench/ray_compare.py [--build build] [--rounds 2]

The workloads (each as baton's benchmarks run it):
  sync_call_us         a no-op actor method, called and awaited one at a time
  calls_per_s          10,000 no-op calls submitted at once, then all awaited
  broadcast4_call_us   a no-op call on 4 actors, awaited together
  tensor_gbps          a 256 MiB float32 array to an actor that returns its sum
                       (Ray: numpy through the object store; the first call
                       and the median of the later ones are both reported)
  dp_proto_gbps        a 64 MiB [256, 65536] float32 batch split by rows over
                       4 actors that return their chunk, the chunks
                       concatenated: 2 × 64 MiB / time (out and back)

Actors take no CPU reservation (4 of them on a 2-core machine, as baton's
cpu(4) pool); numpy and baton's workers each use one thread. Each round runs
baton's two benchmarks first (Ray not started), then starts Ray, runs its
workloads and stops it, so neither system's background processes run during
the other's measurements. Medians over rounds.

Prints one JSON object: per figure, baton, Ray and baton's advantage (for
times Ray / baton, for rates baton / Ray), plus the single-thread memcpy rate
each baton benchmark measured.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def run_baton(build):
    def last_json(cmd):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    rt = last_json([os.path.join(build, "bench", "runtime_bench")])
    dp = last_json([os.path.join(build, "bench", "dispatch_bench")])
    return {
        "sync_call_us": rt["sync_call_us"],
        "calls_per_s": rt["async_calls_per_s"],
        "broadcast4_call_us": rt["broadcast4_call_us"],
        "tensor_gbps": rt["tensor_gbps"],
        "dp_proto_gbps": dp["dp_proto_gbps"],
        "memcpy_gbps_runtime_bench": rt["memcpy_gbps"],
        "memcpy_gbps_dispatch_bench": dp["memcpy_gbps"],
    }


def run_ray():
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0)
        class Bench:
            def noop(self):
                return None

            def sum(self, a):
                return float(a.sum(dtype=np.float64))

            def echo(self, chunk):
                return chunk

        one = Bench.remote()
        ray.get(one.noop.remote())
        for _ in range(200):
            ray.get(one.noop.remote())
        sync = []
        for _ in range(2000):
            t = time.perf_counter()
            ray.get(one.noop.remote())
            sync.append((time.perf_counter() - t) * 1e6)

        t = time.perf_counter()
        ray.get([one.noop.remote() for _ in range(10000)])
        calls_per_s = 10000 / (time.perf_counter() - t)

        four = [Bench.remote() for _ in range(4)]
        ray.get([a.noop.remote() for a in four])
        bcast = []
        for _ in range(500):
            t = time.perf_counter()
            ray.get([a.noop.remote() for a in four])
            bcast.append((time.perf_counter() - t) * 1e6)

        big = np.ones(256 << 18, dtype=np.float32)  # 256 MiB
        tensor = []
        for _ in range(6):
            t = time.perf_counter()
            s = ray.get(one.sum.remote(big))
            tensor.append(big.nbytes / (time.perf_counter() - t) / 1e9)
            assert s == big.size, s

        batch = np.ones((256, 65536), dtype=np.float32)  # 64 MiB
        dp = []
        for _ in range(6):
            t = time.perf_counter()
            chunks = np.split(batch, 4)
            out = np.concatenate(ray.get([a.echo.remote(c) for a, c in zip(four, chunks)]))
            dp.append(2 * batch.nbytes / (time.perf_counter() - t) / 1e9)
            assert out.shape == batch.shape
        return {
            "sync_call_us": statistics.median(sync),
            "calls_per_s": calls_per_s,
            "broadcast4_call_us": statistics.median(bcast),
            "tensor_gbps": statistics.median(tensor[1:]),
            "tensor_gbps_first_call": tensor[0],
            "dp_proto_gbps": statistics.median(dp[1:]),
            "ray_version": ray.__version__,
        }
    finally:
        ray.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()

    baton_rounds, ray_rounds = [], []
    for r in range(args.rounds):
        baton_rounds.append(run_baton(args.build))
        print(json.dumps({"round": r, "baton": baton_rounds[-1]}), file=sys.stderr)
        ray_rounds.append(run_ray())
        print(json.dumps({"round": r, "ray": ray_rounds[-1]}), file=sys.stderr)

    def med(rounds, key):
        return statistics.median(x[key] for x in rounds)

    rows = []
    for key, lower_is_better in (("sync_call_us", True), ("calls_per_s", False),
                                 ("broadcast4_call_us", True), ("tensor_gbps", False),
                                 ("dp_proto_gbps", False)):
        b, y = med(baton_rounds, key), med(ray_rounds, key)
        rows.append({"figure": key, "baton": b, "ray": y,
                     "baton_advantage": y / b if lower_is_better else b / y})
    print(json.dumps({
        "bench": "ray_compare", "rounds": args.rounds,
        "ray_version": ray_rounds[0]["ray_version"], "cores": os.cpu_count(),
        "ray_tensor_gbps_first_call": med(ray_rounds, "tensor_gbps_first_call"),
        "memcpy_gbps_runtime_bench": med(baton_rounds, "memcpy_gbps_runtime_bench"),
        "memcpy_gbps_dispatch_bench": med(baton_rounds, "memcpy_gbps_dispatch_bench"),
        "results": rows}))


if __name__ == "__main__":
    main()
