"""Training data from the lake, read without a JVM (delta-rs), split by time.

The split is by request time, whole requests at a time: the earliest ``train`` share of the
window's requests train, the next ``val`` share validate (early stopping, promotion), the rest
test. History for every split comes from ``user_events`` strictly before each request, so no split
sees the future. Vocabularies are fitted on the training split only: ids first seen later are OOV,
as they would be in production.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

REQUEST_COLUMNS = ["request_id", "user_id", "item_id", "ts", "position", "label", "device", "surface"]


@dataclass(frozen=True)
class SplitConfig:
    train: float = 0.70
    val: float = 0.15  # test is the rest
    max_train_requests: int = 50_000  # sampled (seeded) when the window holds more: a CPU-minutes budget
    max_eval_requests: int = 5_000
    seed: int = 7


def _dataset(cfg, table: str, path: Path | None = None) -> ds.Dataset:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    path = path or cfg.lake.table_path(table)
    try:
        return DeltaTable(str(path)).to_pyarrow_dataset()
    except TableNotFoundError as e:
        raise FileNotFoundError(f"table {table} not found at {path}: ingest a log first") from e


def read_table(cfg, table: str, columns: list[str], source: str | None, until=None, path: Path | None = None
               ) -> pd.DataFrame:
    """``table``'s ``columns`` of one source (all when None), rows with ``ts`` before ``until`` when
    given (pushed into the scan: on a long log the rows after a training window are never read).
    ``path``: the table's folder when it is not the config lake's (a replay point's lake).
    Every Parquet page's CRC is verified, as on every other read of the lake: a flipped byte fails
    the read instead of becoming training data."""
    dataset = _dataset(cfg, table, path)
    flt = pc.field("source") == source if source else None
    if until is not None:
        bound = pa.scalar(pd.Timestamp(until).to_pydatetime(), pa.timestamp("us")).cast(dataset.schema.field("ts").type)
        flt = pc.field("ts") < bound if flt is None else flt & (pc.field("ts") < bound)
    checked = ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    return dataset.to_table(columns=columns, filter=flt, fragment_scan_options=checked).to_pandas()


class LeakingCandidates(ValueError):
    """The source's generated candidates failed the ingest's leak check: a model trained on them
    learns the candidate generator, not the users."""


def candidate_leaks(cfg, source: str | None) -> list[str]:
    """The leak-check findings of ``source``'s ingest runs of generated candidates (click logs; all
    sources when None), one per input and statistic outside ``[quality]``'s band, as
    "INPUT: prior popularity AUC 0.017"; empty when none was ingested or every statistic is inside
    the band. Runs recorded before ingest_runs had ``candidates`` are not judged."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(cfg.lake.table_path("ingest_runs")))
    except TableNotFoundError:
        return []
    have = {f.name for f in table.schema().fields}
    if "candidates" not in have:  # written before candidates were told apart: nothing to judge
        return []
    columns = ["input_path", "candidates"] + sorted(c for c in have if c.endswith("_auc"))  # cfg.quality.leaks judges them
    # to_pandas, not a pyarrow dataset scan: a scan's threads abort the interpreter at exit when
    # nothing else has run (a refusal is the first and last read of a process)
    rows = table.to_pandas(columns=columns, filters=[("source", "=", source)] if source else None).to_dict("records")
    rows = [r for r in rows if r["candidates"] == "generated"]  # logged impressions are as shown, not judged
    return [f"{r['input_path']}: {finding}" for r in sorted(rows, key=lambda r: r["input_path"])
            for finding in cfg.quality.leaks(r)]


def require_leak_free(cfg, source: str | None) -> list[str]:
    """Raise ``LeakingCandidates`` when ``source``'s candidates failed the leak check, unless
    ``[quality] allow_leaking_candidates``; returns the findings (empty for a clean source)."""
    leaks = candidate_leaks(cfg, source)
    q = cfg.quality
    if leaks and not q.allow_leaking_candidates:
        more = f" (and {len(leaks) - 1} more)" if len(leaks) > 1 else ""
        what = q.leak_advice(leaks)
        raise LeakingCandidates(
            f"refusing to train on source {source or 'all'!r}: its generated candidates give the label away, "
            f"{leaks[0]}{more}, outside [{q.leak_auc_min}, {q.leak_auc_max}]; {what}, or pass --allow-leaking-candidates "
            f"([quality] allow_leaking_candidates = true) to go on with every figure marked as leaking")
    return leaks


def load(cfg, source: str | None = None, until=None, extra_labels: list[str] = ()
         ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(requests with known labels, user events, items) of one source (all sources when None).
    ``until``: only requests before this time (a training period that ends where a replay starts);
    events stay whole, since every example reads only the events strictly before its request.
    ``extra_labels``: request_log's other label columns (``conversion``) to keep beside ``label``;
    a log that has none of one is a clear error."""
    requests = read_table(cfg, "request_log", REQUEST_COLUMNS + list(extra_labels), source, until)
    for column in extra_labels:
        if requests[column].isna().all():
            raise ValueError(f"source {source!r} has no {column!r} label (every row NULL): a consumer that learns it "
                             f"needs a log with one (the synthetic world has conversions)")
    requests["ts"] = utc_naive(requests["ts"])
    requests = requests[requests["label"].notna()].reset_index(drop=True)
    events, items = events_and_items(cfg, source)
    if requests.empty:
        before = f" before {until}" if until is not None else ""
        raise ValueError(f"no labelled requests{before} in the lake for source {source!r}: empty training window")
    return requests, events, items


def events_and_items(cfg, source: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(user events, items) of one source (all sources when None): the histories every model reads."""
    events = read_table(cfg, "user_events", ["user_id", "item_id", "ts", "event_type"], source)
    items = read_table(cfg, "items", ["item_id", "category", "subcategory"], source)
    return events.assign(ts=utc_naive(events["ts"])), items


def utc_naive(ts: pd.Series) -> pd.Series:
    """Timestamps as naive UTC, whether the reader returned them zone-aware (delta-rs) or not."""
    ts = pd.to_datetime(ts)
    return ts.dt.tz_convert("UTC").dt.tz_localize(None) if ts.dt.tz is not None else ts


def served_rows(cfg, start=None, end=None, source: str | None = None, tables_root=None,
                table: str = "request_features") -> pd.DataFrame:
    """Labelled candidates of [start, end) (None: unbounded) with the tier and embedding the lookup
    served them (``request_features`` of the lake whose tables are at ``tables_root``, default the
    config's; ``shadow_request_features``: those a rollout's new code space would have served), and
    their context from ``request_log``: what a VM fed the served embedding learns from."""
    path = Path(tables_root) / table if tables_root is not None else None
    columns = ["request_id", "item_id", "user_id", "ts", "label", "tier", "embedding"]
    try:
        served = read_table(cfg, table, columns + ["code_version"], None, end, path=path)
    except pa.ArrowInvalid:  # written before code versions were recorded: every row's is unknown
        served = read_table(cfg, table, columns, None, end, path=path).assign(code_version=None)
    served["ts"] = utc_naive(served["ts"])
    keep = served["label"].notna()
    if start is not None:
        keep &= served["ts"] >= pd.Timestamp(start)
    if end is not None:
        keep &= served["ts"] < pd.Timestamp(end)
    served = served[keep]
    context = read_table(cfg, "request_log", ["request_id", "item_id", "position", "device", "surface"], source)
    # a candidate is served once; in shadow, once per code space
    rows = served.merge(context, on=["request_id", "item_id"], how="left",
                        validate="one_to_one" if table == "request_features" else "many_to_one")
    unknown = rows["device"].isna() & rows["surface"].isna()
    if unknown.any():
        raise ValueError(f"{int(unknown.sum())} served candidates have no request_log row: "
                         f"the features and the log are from different lakes")
    return rows.sort_values(["ts", "request_id", "item_id"], kind="stable").reset_index(drop=True)


def split_by_time(requests: pd.DataFrame, cfg: SplitConfig) -> dict[str, pd.DataFrame]:
    if not 0 < cfg.train < 1 or not 0 < cfg.val < 1 or cfg.train + cfg.val >= 1:
        raise ValueError("train and val shares must be in (0, 1) and leave room for test")
    per_request = requests.groupby("request_id", sort=False)["ts"].min().sort_values(kind="stable")
    n = len(per_request)
    cut1, cut2 = int(n * cfg.train), int(n * (cfg.train + cfg.val))
    ids = {"train": per_request.index[:cut1], "val": per_request.index[cut1:cut2], "test": per_request.index[cut2:]}
    if min(len(v) for v in ids.values()) == 0:
        raise ValueError(f"{n} requests are too few to split into train/val/test")
    rng = np.random.default_rng(cfg.seed)
    out = {}
    for name, chosen in ids.items():
        cap = cfg.max_train_requests if name == "train" else cfg.max_eval_requests
        if len(chosen) > cap:
            chosen = pd.Index(np.sort(rng.choice(np.asarray(chosen), cap, replace=False)))
        out[name] = requests[requests["request_id"].isin(chosen)].reset_index(drop=True)
    return out


def window(splits: dict[str, pd.DataFrame], source: str | None) -> dict:
    return {name: {"rows": len(df), "requests": int(df["request_id"].nunique()),
                   "from": str(df["ts"].min()), "to": str(df["ts"].max()), "ctr": float(df["label"].mean())}
            for name, df in splits.items()} | {"source": source}
