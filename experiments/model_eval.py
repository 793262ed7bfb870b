"""Ingest a log (or take what the lake holds), train the model set on it and compare the models.

    python -m experiments.model_eval --data mind --input ../shared/datasets/mind_small_subset
    python -m experiments.model_eval --data globo --input '../shared/datasets/globo_news_clicks/clicks/*.csv.gz'
    python -m experiments.model_eval --data synthetic            # generates, ingests, trains
    python -m experiments.model_eval --source mind --skip-ingest # what is already in the lake

Prints and writes (JSON + Markdown, under reports/) the table of ``model.training.train_all``:
params, FLOPs per pair, NE, AUC, calibration, NE relative to the VM and transfer ratio on the
time-split test set; every model is saved in the registry (<lake>/models).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from include.config import MODEL_SIZES
from model import training
from spark_jobs.ingest import DATA_SETS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.model_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=DATA_SETS, help="ingest this log first")
    p.add_argument("--input", help="path of the log to ingest")
    p.add_argument("--source", help="source to train on (default: the --data's)")
    p.add_argument("--skip-ingest", action="store_true", help="train on what is already in the lake")
    p.add_argument("--models", choices=MODEL_SIZES, help="model sizes (default: [models] sizes)")
    p.add_argument("--device", default=None, help="auto (CUDA when present), cpu or cuda (default: [models] device)")
    p.add_argument("--max-train-requests", type=int, help="sample at most this many training requests")
    p.add_argument("--reports", default="reports", help="folder for the JSON and Markdown results")
    p.add_argument("--config", help="SOLARIS TOML config")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    from include.config import load_config

    cfg = load_config(a.config)
    source = a.source or a.data
    if a.data and not a.skip_ingest:
        from include.spark import get_spark
        from spark_jobs.ingest import ingest, write_synthetic

        path = a.input
        if a.data == "synthetic" and not path:
            path = write_synthetic(cfg)
        if not path:
            p.error(f"--input is required to ingest --data {a.data}")
        print(f"ingesting {a.data} from {path}")
        spark = get_spark(cfg)
        report = ingest(spark, cfg, a.data, path)
        print("\n".join(report.lines(cfg.lake.database)))
        spark.stop()
    if a.device:
        cfg = cfg.with_overrides(models={"device": a.device})
    ec = training.model_set(a.models or cfg.models.sizes)
    if a.max_train_requests:
        ec = replace(ec, split=replace(ec.split, max_train_requests=a.max_train_requests))
    print(f"training on source {source!r}")
    result = training.train_all(cfg, source, ec)
    print("\n" + training.to_markdown(result))
    js, md = training.write_report(result, Path(a.reports))
    print(f"\nwrote {js} and {md.name}; models under {cfg.models_root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
