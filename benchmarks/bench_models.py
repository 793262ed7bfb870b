"""Model inference throughput on this machine's CPU (or GPU), against its own dense-matmul throughput.

    python benchmarks/bench_models.py [--device cpu|auto] [--threads N] [--per-user 30]

For the FM embedding pass (what the precompute job runs) and the VM forward pass, at several batch
sizes: pairs/s, and achieved GFLOP/s (FLOPs per pair counted by torch's FlopCounterMode x pairs/s)
as a share of the dense float32 matmul GFLOP/s measured in the same run. The FM runs twice on the
same pairs: with one history per pair (every candidate re-encodes its user's history, as the FM
once did) and grouped by user (``--per-user`` candidates share one encoded history, as precompute
now runs it); their ratio is the speed-up of encoding once per user.

Then the grouped FM pass at ``--variant-batch`` three ways on the same pairs: float32 eager (what
precompute runs), bfloat16 autocast, and ``torch.compile`` (float32; its compile time apart): pairs/s
against float32 eager, and how far each moves the embeddings (max absolute difference, and relative
error ||e - e_fp32|| / ||e_fp32||), to hold against ``--tolerance``.
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


def inputs(n, sizes, history_len, code_dim, rng, per_user=1):
    """``n`` pairs of ``n / per_user`` users, each user's pairs sharing one history row."""
    from model.features import COUNTERS

    users = -(-n // per_user)
    hist = rng.integers(2, sizes["n_items"], (users, history_len))
    return {"req": np.repeat(np.arange(users), per_user)[:n], "hist": hist, "hist_cat": np.ones_like(hist),
            "hist_age": rng.integers(1, 16, hist.shape),
            "user": rng.integers(0, sizes["n_users"], n), "item": rng.integers(2, sizes["n_items"], n),
            "hour": rng.integers(0, 24, n), "device": rng.integers(0, 4, n), "surface": rng.integers(0, 4, n),
            "category": np.ones(n, dtype=np.int64), "subcategory": np.ones(n, dtype=np.int64),
            "counters": rng.normal(size=(n, len(COUNTERS))).astype(np.float32), "position": np.zeros(n, np.int64),
            "label": np.zeros(n, dtype=np.float32), "fm": rng.normal(size=(n, code_dim)).astype(np.float32),
            "tier": np.zeros(n, dtype=np.int64)}


def throughput(fn, model, arrays, batch, device, min_seconds=2.0) -> float:
    from model.train import infer

    from model.features import subset

    infer(fn, model, subset(arrays, np.arange(batch)), batch, device)  # warm-up
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
    p.add_argument("--per-user", type=int, default=30, help="candidates per user in the grouped FM pass")
    p.add_argument("--variant-batch", type=int, default=1024, help="batch of the precision and compile comparison")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest relative change of the embeddings a faster variant may make to be kept")
    p.add_argument("--skip-variants", action="store_true", help="no bfloat16 / torch.compile comparison")
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
    rng = np.random.default_rng(0)
    x = inputs(a.pairs, sizes, fm.cfg.history_len, vm.cfg.fm_dim, rng)
    grouped = inputs(a.pairs, sizes, fm.cfg.history_len, vm.cfg.fm_dim, rng, a.per_user)
    from model.features import subset

    flops = {"FM embedding, a history per pair": flops_per_example(fm.embed, fm, subset(x, np.arange(256))),
             f"FM embedding, {a.per_user} pairs per user": flops_per_example(fm.embed, fm, subset(grouped, np.arange(a.per_user * 8))),
             "VM + FM embedding": flops_per_example(vm, vm, subset(x, np.arange(256)))}
    peak = matmul_gflops(device)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, device {device}, torch {torch.__version__}")
    print(f"dense float32 matmul (2048^3): {peak:.1f} GFLOP/s\n")
    print("| model | FLOPs/pair | batch | pairs/s | GFLOP/s | share of matmul GFLOP/s |\n|---|---:|---:|---:|---:|---:|")
    best = {}
    for (name, model, fn), data in zip(((n, m, f) for n, m, f in (
            ("FM embedding, a history per pair", fm, fm.embed), (f"FM embedding, {a.per_user} pairs per user", fm, fm.embed),
            ("VM + FM embedding", vm, vm))), (x, grouped, x)):
        for batch in (64, 256, 1024, 4096):
            pps = throughput(fn, model, data, batch, device)
            best[name] = max(best.get(name, 0), pps)
            gf = pps * flops[name] / 1e9
            print(f"| {name} | {flops[name]:,.0f} | {batch} | {pps:,.0f} | {gf:.2f} | {100 * gf / peak:.1f}% |", flush=True)
    one, per_user = best["FM embedding, a history per pair"], best[f"FM embedding, {a.per_user} pairs per user"]
    print(f"\nFM pairs/s, best batch: grouped by user {per_user:,.0f} vs a history per pair {one:,.0f} ({per_user / one:.1f}x)")
    print(f"FM/VM FLOPs per pair (a history per pair): {flops['FM embedding, a history per pair'] / flops['VM + FM embedding']:.0f}x")
    if not a.skip_variants:
        variants(fm, grouped, a.variant_batch, device, a.tolerance, a.per_user)
    return 0


def variants(fm, arrays, batch, device, tolerance, per_user) -> None:
    """The grouped FM pass as float32 eager, bfloat16 autocast and torch.compile, on the same pairs."""
    from model.train import infer

    def autocast_bf16(b):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            return fm.embed(b)

    started = time.perf_counter()
    compiled = torch.compile(fm.embed, dynamic=True)
    infer(compiled, fm, arrays, batch, device)  # compiles (a few shapes: the last batch is shorter)
    compile_s = time.perf_counter() - started
    reference = infer(fm.embed, fm, arrays, batch, device)
    base = throughput(fm.embed, fm, arrays, batch, device, min_seconds=4.0)
    print(f"\nFM embedding, {per_user} pairs per user, batch {batch}: precision and compilation "
          f"(tolerance: relative change <= {tolerance:g})\n")
    print("| variant | pairs/s | vs float32 eager | max abs change | relative change | kept |\n|---|---:|---:|---:|---:|---|")
    print(f"| float32 eager | {base:,.0f} | 1.00x | 0 | 0 | baseline |")
    for name, fn in ((f"torch.compile (float32; compiled in {compile_s:.0f} s)", compiled),
                     ("bfloat16 autocast", autocast_bf16)):
        got = infer(fn, fm, arrays, batch, device)
        rel = float(np.linalg.norm(got - reference) / np.linalg.norm(reference))
        pps = throughput(fn, fm, arrays, batch, device, min_seconds=4.0)
        kept = "yes" if pps > base and rel <= tolerance else ("no: slower" if pps <= base else "no: moves the embeddings")
        print(f"| {name} | {pps:,.0f} | {pps / base:.2f}x | {np.abs(got - reference).max():.2e} | {rel:.2e} | {kept} |",
              flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
