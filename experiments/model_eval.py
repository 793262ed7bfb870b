"""Ingest a log (or take what the lake holds), train the model set on it and compare the models.

    python -m experiments.model_eval --data synthetic            # generates the impression world, ingests, trains
    python -m experiments.model_eval --data mind --input ../shared/datasets/mind_small_subset
    python -m experiments.model_eval --data globo --input '../shared/datasets/globo_news_clicks/clicks/*.csv.gz'
    python -m experiments.model_eval --data clicklog --input clicks.csv --ts-unit s --map item_id=article
    python -m experiments.model_eval --data impressions --input shown.csv --ts-unit s
    python -m experiments.model_eval --source mind --skip-ingest # what is already in the lake

Prints and writes (JSON + Markdown, under reports/) the table of ``model.training.train_all``:
params, FLOPs per pair, NE, AUC, calibration, NE relative to the VM and transfer ratio on the
time-split test set, all with paired-bootstrap intervals, beside a popularity baseline and a plain
matrix factorisation (model/baselines.py); every model is saved in the registry
(<lake>/models). On a simulated log whose ingest wrote the ``truth`` table (the synthetic world),
also the Bayes NE and the share of the VM-to-Bayes gap that each model closes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from include.config import MODEL_SIZES
from model import training
from spark_jobs.ingest import DATA_SETS, add_log_arguments, check_log_arguments, log_arguments


def arguments(prog: str, description: str) -> argparse.ArgumentParser:
    """The command line of an experiment that ingests a log (or takes the lake's) and trains on it."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--data", choices=DATA_SETS, help="ingest this log first")
    p.add_argument("--input", help="path of the log to ingest")
    p.add_argument("--source", help="source to train on (default: the --data's)")
    p.add_argument("--skip-ingest", action="store_true", help="train on what is already in the lake")
    add_log_arguments(p)
    from include import synthetic_world

    synthetic_world.add_arguments(p)
    p.add_argument("--models", choices=MODEL_SIZES, help="model sizes (default: [models] sizes)")
    p.add_argument("--device", default=None, help="auto (CUDA when present), cpu or cuda (default: [models] device)")
    p.add_argument("--max-train-requests", type=int, help="sample at most this many training requests")
    p.add_argument("--reports", default="reports", help="folder for the JSON and Markdown results")
    p.add_argument("--config", help="SOLARIS TOML config")
    from include.cli import add_leak_override

    add_leak_override(p)
    return p


def prepare(p: argparse.ArgumentParser, a: argparse.Namespace):
    """Ingest what ``a`` asks for; (config, source to train on, model set)."""
    from include import synthetic_world
    from include.config import load_config

    check_log_arguments(p, a)
    extra = log_arguments(a)
    from include.cli import with_leak_override

    cfg = with_leak_override(load_config(a.config), a)
    source = a.source or ("impressions" if a.data == "impressions" else a.data)
    if a.data and not a.skip_ingest:
        from include.spark import get_spark
        from spark_jobs.ingest import ingest, write_synthetic

        path = a.input
        if a.data == "synthetic" and not path:
            path = write_synthetic(cfg, wcfg=synthetic_world.from_arguments(a))
        if not path:
            p.error(f"--input is required to ingest --data {a.data}")
        print(f"ingesting {a.data} from {path}")
        spark = get_spark(cfg)
        report = ingest(spark, cfg, a.data, path, extra)
        print("\n".join(report.lines(cfg.lake.database)))
        spark.stop()
        source = a.source or report.source
    if a.device:
        cfg = cfg.with_overrides(models={"device": a.device})
    ec = training.model_set(a.models or cfg.models.sizes)
    if a.max_train_requests:
        ec = replace(ec, split=replace(ec.split, max_train_requests=a.max_train_requests))
    return cfg, source, ec


def main(argv: list[str] | None = None) -> int:
    p = arguments("python -m experiments.model_eval", __doc__.split("\n\n")[0])
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    cfg, source, ec = prepare(p, a)
    print(f"training on source {source!r}")
    from model.data import LeakingCandidates

    try:
        result = training.train_all(cfg, source, ec)
    except LeakingCandidates as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    markdown = training.to_markdown(result)
    from experiments import truth

    known = truth.read_truth(cfg.lake.tables_path, source)
    if known is not None:
        gap = truth.bayes_gap(result["predictions"], known, [r["model"] for r in result["rows"]],
                              resamples=ec.bootstrap_resamples, seed=ec.split.seed)
        result["bayes"] = gap
        markdown += "\n\n" + truth.to_markdown(gap)
    print("\n" + markdown)
    js, md = training.write_report(result, Path(a.reports), markdown)
    print(f"\nwrote {js} and {md.name}; models under {cfg.models_root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
