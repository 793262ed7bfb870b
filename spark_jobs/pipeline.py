"""The SOLARIS main job on one data set, end to end, with progress as it goes.

    python -m spark_jobs.pipeline                       # synthetic log, embedded lake (./lake)
    python -m spark_jobs.pipeline --data mind --input ../shared/datasets/mind_small_subset
    python -m spark_jobs.pipeline --data globo --input '../shared/datasets/globo_news_clicks/clicks/*.csv.gz'

Stages: (generate the synthetic impression world) -> ingest with quarantine and data-quality checks -> summary of
what landed where -> train the FM, autoencoder and VM variants and compare them -> hourly
cycles over the log's last hours: speculative precompute (verifier scoring, FM embeddings
with TTL), user means, FAISS neighbors, publication, as-of resolution and the coverage by tier.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

from include.config import MODEL_SIZES
from spark_jobs.ingest import DATA_SETS, ingest, synthetic_input


class Progress:
    def __init__(self, total: int):
        self.total, self.n, self.t0 = total, 0, time.perf_counter()

    def stage(self, title: str):
        self.n += 1
        print(f"\n[{self.n}/{self.total}] {title}  (+{time.perf_counter() - self.t0:.0f} s)", flush=True)


def summarize(spark, cfg) -> list[str]:
    """Where the data landed: per table, rows, location and partitions."""
    from feature_store.tables import ALL_TABLES, qualified_name

    lines, empty = [], []
    for spec in ALL_TABLES:
        name = qualified_name(spec, cfg.lake.database)
        if not spark.catalog.tableExists(name):
            continue
        rows = spark.table(name).count()
        if not rows:  # declared and created, filled by later stages: one line for all of them
            empty.append(spec.name)
            continue
        parts = ""
        if spec.partition_by:
            n = spark.table(name).select(*spec.partition_by).distinct().count()
            parts = f", {n} partitions by ({', '.join(spec.partition_by)})"
        lines.append(f"  {name:<32} {rows:>12,} rows  at {cfg.lake.table_path(spec.name)}{parts}")
    if empty:
        wrapped = textwrap.wrap(", ".join(empty), 96, initial_indent="  empty so far (filled by later stages): ",
                                subsequent_indent="    ")
        lines += [*wrapped, f"    (each at {cfg.lake.tables_path}/<table>)"]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.pipeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=DATA_SETS, default="synthetic")
    p.add_argument("--input", help="data path (for synthetic: where to write the generated log)")
    p.add_argument("--config", help="SOLARIS TOML config")
    from include import synthetic_world

    synthetic_world.add_arguments(p)
    p.add_argument("--models", choices=[*MODEL_SIZES, "none"],
                   help="model sizes for the training stage (default: [models] sizes, quick: small, CPU-minutes; "
                        "none: skip)")
    p.add_argument("--reports", default="reports", help="folder for the evaluation JSON and Markdown")
    p.add_argument("--precompute-hours", type=int, default=3,
                   help="hourly precompute runs over the log's last hours (0: skip; needs --models)")
    from include.cli import add_leak_override, add_verbose, with_leak_override, with_verbose

    add_leak_override(p)
    add_verbose(p)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    with_verbose(a)

    from include.config import load_config

    cfg = with_leak_override(load_config(a.config), a)
    a.models = a.models or cfg.models.sizes
    precompute_hours = a.precompute_hours if a.models != "none" else 0
    progress = Progress(total=(4 if a.data == "synthetic" else 3) + (a.models != "none") + (precompute_hours > 0))
    input_path = a.input
    if a.data == "synthetic":
        input_path = input_path or str(synthetic_input(cfg))
        progress.stage(f"generate the synthetic impression world -> {input_path}")
        wcfg = synthetic_world.from_arguments(a)
        world = synthetic_world.generate(wcfg)
        synthetic_world.write(world, input_path)
        imp = world["impressions"]
        print(f"  {len(imp['ts']):,} impressions in {len(set(imp['request_id'])):,} requests, {int(imp['label'].sum()):,} "
              f"clicks; {wcfg.users} users, {wcfg.items} items, {wcfg.hours} hours from {wcfg.start} UTC")
    elif not input_path:
        p.error(f"--input is required for --data {a.data}")

    progress.stage(f"start Spark ({cfg.spark.master}) with the Delta lake at {cfg.lake.root_path}")
    from include.spark import get_spark

    spark = get_spark(cfg)

    progress.stage(f"ingest {a.data} from {input_path} (bad records -> quarantine, quality checks before write)")
    report = ingest(spark, cfg, a.data, input_path)
    print("\n".join(report.lines(cfg.lake.database)))

    progress.stage("what landed where")
    print("\n".join(summarize(spark, cfg)))
    if a.models != "none":
        from model import training

        source = report.source
        progress.stage(f"train the FM, autoencoder and VM variants on {source} ({a.models} sizes) and compare")
        ec = training.model_set(a.models)
        from model.data import LeakingCandidates

        try:
            result = training.train_all(cfg, source, ec)
        except LeakingCandidates as e:
            p.exit(2, f"{p.prog}: error: {e}\n")
        print("\n" + training.to_markdown(result))
        paths = training.write_report(result, Path(a.reports))
        print(f"  report: {paths[0]} and {paths[1].name}; models under {cfg.lake.root_path / 'models'}")
    if precompute_hours > 0:
        from datetime import timedelta

        from spark_jobs import coverage, cycle

        last = report.max_ts.replace(minute=0, second=0, microsecond=0)
        ends = [last - timedelta(hours=h) for h in range(precompute_hours - 1, -1, -1)]
        progress.stage(f"hourly cycles (resolve, precompute, user means, neighbors, publish) for "
                       f"{ends[0]} .. {ends[-1]}, then coverage of the requests they served")
        for t in ends:
            print(f"-- cycle at {t}")
            cycle.run(spark, cfg, t)
        db = cfg.lake.database
        spark.sql(f"SELECT run_id, pairs_scored, pairs_selected, already_fresh, pairs_embedded, expired_removed "
                  f"FROM {db}.precompute_runs ORDER BY run_id").show(truncate=False)
        if len(ends) > 1:  # requests after the first publication; the first cycle had nothing to serve from
            print(f"coverage by tier of the requests in [{ends[0]}, {ends[-1]}):")
            print(coverage.table(coverage.run(spark, cfg, ends[0], ends[-1])))
    print(f'\nquery it: python -m include.sql "SELECT count(*) FROM {cfg.lake.database}.request_log"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
