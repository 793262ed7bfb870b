"""The one ingest dispatcher: a named log (``mind``, ``globo``, ``synthetic``, ``clicklog``) at a
path -> the adapter that reads it. The main job, the model evaluation and the replay all ingest
through here, so a log lands the same way whichever entry point a user starts from."""

from __future__ import annotations

from pathlib import Path

DATA_SETS = ("synthetic", "mind", "globo", "clicklog")


def ingest(spark, cfg, data: str, input_path: str):
    """Ingest ``input_path`` as the log kind ``data``; returns the adapter's report."""
    if data not in DATA_SETS:
        raise ValueError(f"unknown data set {data!r}; known: {', '.join(DATA_SETS)}")
    if data == "mind":
        from spark_jobs import ingest_mind

        base = Path(input_path)
        behaviors = str(base / "behaviors.tsv") if base.is_dir() else input_path
        news = base / "news.tsv" if base.is_dir() else None
        return ingest_mind.ingest(spark, cfg, behaviors, str(news) if news and news.exists() else None)
    from spark_jobs import ingest_clicklog

    preset = "globo" if data == "globo" else "generic"
    args = ingest_clicklog.parse_args(["--input", input_path, "--preset", preset]
                                      + (["--source", "synthetic"] if data == "synthetic" else []))
    return ingest_clicklog.ingest(spark, cfg, input_path, ingest_clicklog.spec_from_args(args, cfg), "csv")


def synthetic_input(cfg) -> Path:
    """Where a generated synthetic log goes when no path is given: beside the lake, under data/."""
    return cfg.lake.root_path.parent / "data" / "synthetic" / "clicks.csv"


def write_synthetic(cfg, path: str | None = None, scfg=None) -> str:
    """Generate the synthetic click log (default size unless ``scfg``) at ``path``; returns the path."""
    from include import synthetic

    path = path or str(synthetic_input(cfg))
    synthetic.write_csv(synthetic.generate(scfg or synthetic.SyntheticConfig()), path)
    return path
