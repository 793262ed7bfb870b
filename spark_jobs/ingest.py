"""The one ingest dispatcher: a named log (``synthetic``, ``mind``, ``globo``, ``clicklog``,
``impressions``) at a path -> the adapter that reads it. The main job, the model evaluation and the
replay all ingest through here, so a log lands the same way whichever entry point a user starts from.

``synthetic`` is the folder the impression world writes (``include/synthetic_world.py``:
impressions.csv, items.csv and truth.csv); ``impressions`` any impression log (a file, or a folder
with impressions.csv and optionally items.csv); ``clicklog`` a click-only log in the generic format.
"""

from __future__ import annotations

from pathlib import Path

DATA_SETS = ("synthetic", "mind", "globo", "clicklog", "impressions")


# The logs read through a column mapping and a time unit; the others have one fixed format.
MAPPED = ("clicklog", "globo", "impressions")


def ingest(spark, cfg, data: str, input_path: str, log_args: list[str] | None = None):
    """Ingest ``input_path`` as the log kind ``data``; returns the adapter's report. ``log_args``:
    the adapter's options for a mapped log (``--map``, ``--ts-unit``, ``--items``, ``--format``),
    as ``log_arguments`` gives them; refused for a log of a fixed format."""
    if data not in DATA_SETS:
        raise ValueError(f"unknown data set {data!r}; known: {', '.join(DATA_SETS)}")
    if log_args and data not in MAPPED:
        raise ValueError(fixed_format_refusal(log_args[::2], data))
    base = Path(input_path)
    if data == "mind":
        from spark_jobs import ingest_mind

        behaviors = str(base / "behaviors.tsv") if base.is_dir() else input_path
        news = base / "news.tsv" if base.is_dir() else None
        return ingest_mind.ingest(spark, cfg, behaviors, str(news) if news and news.exists() else None)
    if data in ("synthetic", "impressions"):
        from include import synthetic_world
        from spark_jobs import ingest_impressions as ii

        log = base / synthetic_world.IMPRESSIONS if base.is_dir() else base
        items, truth = (base / synthetic_world.ITEMS, base / synthetic_world.TRUTH) if base.is_dir() else (None, None)
        args = ii.parse_args(["--input", str(log), "--source", data if data == "synthetic" else "impressions",
                              *(log_args or [])])
        items = args.items or (str(items) if items and items.exists() else None)
        return ii.ingest(spark, cfg, str(log), ii.spec_from_args(args), args.format, items,
                         str(truth) if truth and truth.exists() else None)
    from spark_jobs import ingest_clicklog

    preset = "globo" if data == "globo" else "generic"
    args = ingest_clicklog.parse_args(["--input", input_path, "--preset", preset, *(log_args or [])])
    return ingest_clicklog.ingest(spark, cfg, input_path, ingest_clicklog.spec_from_args(args, cfg), args.format,
                                  getattr(args, "items", None))


def fixed_format_refusal(flags: list[str], data: str | None) -> str:
    """Why ``flags`` cannot go with ``--data data`` (a log of one fixed format, or none given), and what can."""
    named = " and ".join(flags)
    one = len(flags) == 1
    if data is None:
        return f"{named} {'describes' if one else 'describe'} the log to ingest: give it with --data and --input"
    return (f"{named} {'applies' if one else 'apply'} to logs read through a column mapping (--data "
            f"{', '.join(MAPPED[:-1])} or {MAPPED[-1]}), not to --data {data}, whose format is fixed; to read a "
            "file of another layout, give it as --data impressions (one row per candidate shown) or --data "
            "clicklog (clicks only)")


def check_log_arguments(parser, args) -> None:
    """An entry point's usage error (``parser.error``) when mapped-log options came with a ``--data``
    they do not suit, or with none."""
    given = log_arguments(args)
    if given and args.data not in MAPPED:
        parser.error(fixed_format_refusal(given[::2], args.data))


def add_log_arguments(parser) -> None:
    """The mapped logs' options, for entry points that ingest before they evaluate."""
    g = parser.add_argument_group("logs read through a column mapping (--data clicklog, globo or impressions), as "
                                  "python -m spark_jobs.ingest_clicklog and ingest_impressions take them")
    g.add_argument("--map", help="comma list of solaris_col=input_col (user_id, item_id, ts, context, category, ...)")
    g.add_argument("--ts-unit", choices=["ms", "s", "iso"], help="timestamp unit (default ms)")
    g.add_argument("--items", help="item attribute file: item_id, category, subcategory, title")
    g.add_argument("--format", choices=["csv", "parquet"], help="input format (default csv)")


def log_arguments(args) -> list[str]:
    """The mapped-log options given (``add_log_arguments``), as the adapter's command line."""
    out = []
    for flag in ("map", "ts_unit", "items", "format"):
        value = getattr(args, flag, None)
        if value:
            out += [f"--{flag.replace('_', '-')}", value]
    return out


def synthetic_input(cfg) -> Path:
    """Where a generated synthetic world goes when no path is given: beside the lake, under data/."""
    return cfg.lake.root_path.parent / "data" / "synthetic"


def write_synthetic(cfg, path: str | None = None, wcfg=None) -> str:
    """Generate the synthetic impression world (default size unless ``wcfg``) in the folder
    ``path``; returns the folder."""
    from include import synthetic_world

    path = path or str(synthetic_input(cfg))
    synthetic_world.write(synthetic_world.generate(wcfg or synthetic_world.WorldConfig()), path)
    return path
