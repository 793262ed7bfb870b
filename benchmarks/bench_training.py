"""FM training throughput on this machine: rows/s and minutes to train on a large log.

    python benchmarks/bench_training.py [--rows 500000] [--sizes quick full] [--device cpu]

Generates a synthetic impression world large enough for ``--rows`` training rows, builds the model
inputs (model/features.py, as ``train_all`` does) and trains the FM of each model-size set until
its validation NE stops (at most the set's epoch bound), as the daily training does. Reports per
set: training rows, epochs run, seconds to build the inputs, seconds per epoch, rows/s, total
minutes, and the FM's validation and test NE against the VM's on the same split, so that a faster
setting that learns less shows up. The grouped FM (a history encoded once per request) is what
makes this affordable; ``--per-row`` trains with one history per row instead, for comparison.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def world_frames(rows: int, seed: int):
    from include import synthetic_world as sw

    # about 10 impressions per request, 70% of the requests train: enough hours of traffic for ``rows``
    hours = max(48, int(np.ceil(rows / 0.7 / (350 * 2 * 10) * 1.05)))
    w = sw.generate(sw.WorldConfig(hours=hours, seed=seed))
    im = pd.DataFrame(w["impressions"])
    im["ts"] = pd.to_datetime(im["ts"], unit="ms")
    im["request_id"] = "synthetic:" + im["request_id"]
    im[["device", "surface"]] = im[["device", "surface"]].astype(str)
    events = im[im["label"] == 1][["user_id", "item_id", "ts"]].assign(event_type="click")
    return im, events, pd.DataFrame(w["items"]), hours


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=500_000, help="training rows (the world is sized for them)")
    p.add_argument("--sizes", nargs="+", default=["quick", "full"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--per-row", action="store_true", help="one history per row (no grouping by request)")
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args(argv)

    import torch

    from model import training
    from model.data import split_by_time
    from model.features import Vocab, build_examples, row_inputs
    from model.fm import FMConfig, FoundationModel
    from model.metrics import normalized_entropy
    from model.train import bce_loss, fit, infer, pick_device, sigmoid
    from model.vm import VerticalModel, VMConfig

    t0 = time.perf_counter()
    requests, events, items, hours = world_frames(a.rows, a.seed)
    print(f"world: {len(requests):,} impressions over {hours} h ({time.perf_counter() - t0:.0f} s); "
          f"{torch.get_num_threads()} torch threads, device {pick_device(a.device)}\n")
    print("| sizes | train rows | epochs | inputs s | s/epoch | rows/s | total min | FM val NE | FM test NE | VM test NE |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sizes in a.sizes:
        ec = training.model_set(sizes)
        n_req = int(a.rows / 10 / 0.7) + 1
        split = replace(ec.split, max_train_requests=n_req, max_eval_requests=max(5000, n_req // 10))
        parts = split_by_time(requests, split)
        t1 = time.perf_counter()
        vocab = Vocab.fit(parts["train"], events[events["ts"] <= parts["train"]["ts"].max()], items)
        group = "row_key" if a.per_row else "request_id"
        x = {k: build_examples(v.assign(row_key=np.arange(len(v))), events, vocab, ec.history_len, items,
                               ec.horizon_hours, group_by=group) for k, v in parts.items()}
        built = time.perf_counter() - t1
        sizes_kw = dict(n_users=vocab.size("user"), n_items=vocab.size("item"), n_devices=vocab.size("device"),
                        n_surfaces=vocab.size("surface"))
        torch.manual_seed(a.seed)
        fm = FoundationModel(FMConfig(**sizes_kw, n_categories=vocab.size("category"),
                                      n_subcategories=vocab.size("subcategory"), history_len=ec.history_len,
                                      horizon_hours=ec.horizon_hours, dim=ec.fm_dim, layers=ec.fm_layers,
                                      trunk=ec.fm_trunk, embedding_dim=ec.fm_embedding))
        t2 = time.perf_counter()
        hist = fit(fm, bce_loss, x["train"], x["val"], replace(ec.fm_train, device=a.device), log=lambda *_: None)
        train_s = time.perf_counter() - t2
        epochs = len(hist["epochs"])
        y = x["test"]["label"]
        fm_ne = normalized_entropy(y, sigmoid(infer(fm, fm, x["test"], device=a.device)))
        torch.manual_seed(a.seed)
        vm = VerticalModel(VMConfig(**sizes_kw))
        fit(vm, bce_loss, row_inputs(x["train"]), row_inputs(x["val"]), replace(ec.vm_train, device=a.device),
            log=lambda *_: None)
        vm_ne = normalized_entropy(y, sigmoid(infer(vm, vm, row_inputs(x["test"]), device=a.device)))
        rows = len(x["train"]["label"])
        print(f"| {sizes}{' (a history per row)' if a.per_row else ''} | {rows:,} | {epochs} | {built:.0f} | "
              f"{train_s / epochs:.0f} | {rows * epochs / train_s:,.0f} | {(built + train_s) / 60:.1f} | "
              f"{hist['best_val_ne']:.4f} | {fm_ne:.4f} | {vm_ne:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
