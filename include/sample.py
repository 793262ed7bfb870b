"""A user-sampled slice of a click log, for replays and sweeps that cannot afford the whole log:

    python -m include.sample --input '../shared/datasets/globo_news_clicks/clicks/*.csv.gz' \\
        --fraction 0.05 --out data/globo_5pct/clicks.csv.gz

Keeps every row of the users whose id hashes (CRC-32) below ``fraction``: the same users for the
same fraction on every run and every machine, and whole histories, so point-in-time features of a
kept user are what they are in the full log. Rows are written unchanged (same columns), so the
slice ingests with the same preset as the full log.
"""

from __future__ import annotations

import argparse
import glob
import sys
import zlib
from pathlib import Path


def keep_user(user_id: object, fraction: float) -> bool:
    return zlib.crc32(str(user_id).encode()) < fraction * 2**32


def sample(paths: list[str], out: Path, fraction: float, user_column: str) -> tuple[int, int]:
    """Write the kept rows of ``paths`` (CSV, optionally compressed) to ``out``; (rows in, rows out)."""
    import pandas as pd

    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not paths:
        raise FileNotFoundError("no input files matched")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows_in = rows_out = 0
    header = True
    tmp = out.with_name(out.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            for path in sorted(paths):
                df = pd.read_csv(path, dtype=str, keep_default_na=False)
                if user_column not in df.columns:
                    raise ValueError(f"{path}: no column {user_column!r} (columns: {', '.join(df.columns)})")
                kept = df[df[user_column].map(lambda u: keep_user(u, fraction))]
                rows_in, rows_out = rows_in + len(df), rows_out + len(kept)
                kept.to_csv(f, index=False, header=header)
                header = False
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written slice left behind
        raise
    if out.suffix == ".gz":
        import gzip
        import shutil

        with open(tmp, "rb") as src, gzip.open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        tmp.unlink()
    else:
        tmp.replace(out)
    return rows_in, rows_out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m include.sample", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="a CSV file or a glob of them (quote it)")
    p.add_argument("--out", required=True, type=Path, help="output CSV (.csv or .csv.gz)")
    p.add_argument("--fraction", type=float, required=True, help="share of users kept, in (0, 1]")
    p.add_argument("--user-column", default="user_id")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    rows_in, rows_out = sample(glob.glob(a.input), a.out, a.fraction, a.user_column)
    print(f"{rows_out:,} of {rows_in:,} rows kept ({a.fraction:.1%} of users) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
