"""Model inference throughput on this machine's CPU, against its own dense-matmul throughput.

    python benchmarks/bench_models.py [--device cpu] [--threads N]

For the FM embedding pass (what the precompute job runs) and the VM forward pass, at several batch
sizes: pairs/s, and achieved GFLOP/s (FLOPs per pair counted by torch's FlopCounterMode x pairs/s)
as a share of the dense float32 matmul GFLOP/s measured in the same run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def matmul_gflops(device, n=2048, repeats=10) -> float:
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    torch.mm(a, b)
    t = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * n ** 3 * repeats / (time.perf_counter() - t) / 1e9


def inputs(n, sizes, history_len, code_dim, rng):
    return {"user": rng.integers(0, sizes["n_users"], n), "item": rng.integers(2, sizes["n_items"], n),
            "hist": rng.integers(2, sizes["n_items"], (n, history_len)), "hour": rng.integers(0, 24, n),
            "device": rng.integers(0, 4, n), "surface": rng.integers(0, 4, n), "category": np.zeros(n, dtype=np.int64),
            "label": np.zeros(n, dtype=np.float32), "fm": rng.normal(size=(n, code_dim)).astype(np.float32),
            "tier": np.zeros(n, dtype=np.int64)}


def throughput(fn, model, arrays, batch, device, min_seconds=2.0) -> float:
    from model.train import infer

    infer(fn, model, {k: v[:batch] for k, v in arrays.items()}, batch, device)  # warm-up
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < min_seconds:
        infer(fn, model, arrays, batch, device)
        n += len(arrays["label"])
    return n / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--pairs", type=int, default=8192)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    from model.fm import FMConfig, FoundationModel
    from model.train import flops_per_example, pick_device
    from model.vm import VerticalModel, VMConfig

    device = pick_device(a.device)
    sizes = dict(n_users=100_000, n_items=50_000, n_devices=6, n_surfaces=6)
    fm = FoundationModel(FMConfig(**sizes)).eval()
    vm = VerticalModel(VMConfig(**sizes, use_fm_embedding=True)).eval()
    x = inputs(a.pairs, sizes, fm.cfg.history_len, vm.cfg.fm_dim, np.random.default_rng(0))
    flops = {"FM embedding": flops_per_example(fm.embed, fm, {k: v[:64] for k, v in x.items()}),
             "VM + FM embedding": flops_per_example(vm, vm, {k: v[:64] for k, v in x.items()})}
    peak = matmul_gflops(device)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, device {device}, torch {torch.__version__}")
    print(f"dense float32 matmul (2048^3): {peak:.1f} GFLOP/s\n")
    print("| model | FLOPs/pair | batch | pairs/s | GFLOP/s | share of matmul GFLOP/s |\n|---|---:|---:|---:|---:|---:|")
    for name, model, fn in (("FM embedding", fm, fm.embed), ("VM + FM embedding", vm, vm)):
        for batch in (64, 256, 1024, 4096):
            pps = throughput(fn, model, x, batch, device)
            gf = pps * flops[name] / 1e9
            print(f"| {name} | {flops[name]:,.0f} | {batch} | {pps:,.0f} | {gf:.2f} | {100 * gf / peak:.1f}% |", flush=True)
    print(f"\nFM/VM FLOPs per pair: {flops['FM embedding'] / flops['VM + FM embedding']:.0f}x")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
