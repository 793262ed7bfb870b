"""Click-log ingestion: synthetic and Globo-format input, every bad-input case, idempotency."""

import gzip
import json

import pytest

from include import synthetic
from spark_jobs import ingest_clicklog as ic

pytestmark = pytest.mark.spark

HEADER = "user_id,item_id,ts,surface,device,region,referrer"
H0 = 1767571200000  # 2026-01-05T00:00:00Z in ms


def spec(cfg, preset="generic", **kw):
    args = ic.parse_args(["--input", "x", "--preset", preset] + sum(([f"--{k.replace('_', '-')}", v] for k, v in kw.items()), []))
    return ic.spec_from_args(args, cfg)


def table(spark, cfg, name):
    return spark.table(f"{cfg.lake.database}.{name}")


def test_synthetic_log_lands_as_requests(spark, make_cfg, tmp_path):
    cfg = make_cfg("click_syn", clicklog={"negatives_per_click": 4, "pool_size": 20})
    cols = synthetic.generate(synthetic.SyntheticConfig(users=100, items=60, hours=6, visits_per_hour=20))
    path = tmp_path / "clicks.csv"
    n = synthetic.write_csv(cols, path)
    report = ic.ingest(spark, cfg, str(path), spec(cfg, source="synthetic"))
    assert report.records_in == n and report.quarantined == 0
    assert report.requests == n and report.event_rows == n
    rl = table(spark, cfg, "request_log")
    assert rl.where("label = 1").count() == n  # one positive per request
    per_request = {r.request_id: r["count"] for r in rl.groupBy("request_id").count().collect()}
    assert max(per_request.values()) == 5  # the click plus K=4
    first_hour_ms = H0 + 3_600_000
    # the log's first hour draws from its own clicks: no earlier hour is needed
    assert any(c > 1 for rid, c in per_request.items() if int(rid.split(":")[2]) < first_hour_ms)
    assert {r.hour for r in rl.select("hour").distinct().collect()} == set(range(6))
    # the leak check ran on the generated candidates, is recorded with the run and printed
    run = table(spark, cfg, "ingest_runs").collect()[0]
    assert (run.popularity_auc, run.recent_click_auc, run.position_auc) == \
        (report.popularity_auc, report.recent_click_auc, report.position_auc)
    assert 0 < report.popularity_auc < 1 and 0 < report.recent_click_auc < 1 and 0 < report.position_auc < 1
    assert any(line.startswith("  leak check, single-feature AUC") for line in report.lines(cfg.lake.database))


def test_a_table_of_an_older_declaration_gains_the_new_columns_and_keeps_its_rows(spark, make_cfg):
    from dataclasses import replace

    from feature_store.tables import INGEST_RUNS, ensure_table

    cfg = make_cfg("old_runs")
    old = replace(INGEST_RUNS, columns=INGEST_RUNS.columns[:INGEST_RUNS.column_names.index("popularity_auc")])
    name = ensure_table(spark, old, cfg)
    spark.sql(f"INSERT INTO {name} (run_id, source) VALUES ('r1', 'x')")
    assert ensure_table(spark, INGEST_RUNS, cfg) == name
    assert spark.table(name).columns == INGEST_RUNS.column_names
    row = spark.table(name).collect()
    assert [(r.run_id, r.source, r.popularity_auc) for r in row] == [("r1", "x", None)]


def test_a_catalog_that_came_with_a_copied_lake_is_repointed_or_refused(spark, make_cfg, tmp_path):
    """The database's entries point into another lake (its metastore was copied with it): tables
    whose data is in this lake are re-pointed and the other lake is never written; one not copied
    is left and named; with a shared metastore the job refuses with what to do."""
    import shutil

    from deltalake import DeltaTable

    from feature_store import lake
    from feature_store.tables import INGEST_RUNS, ITEMS, ensure_table
    from include.spark import CatalogLocationError, ensure_database

    orig = make_cfg("entry_orig")
    name = ensure_table(spark, ITEMS, orig)
    ensure_table(spark, INGEST_RUNS, orig)
    spark.sql(f"INSERT INTO {name} (item_id, category) VALUES ('i1', 'news')")
    here = orig.with_overrides(lake={"root": str(tmp_path / "here")})  # same database, so the same entries
    shutil.copytree(orig.lake.table_path("items"), here.lake.table_path("items"))  # ingest_runs not copied
    shared = here.with_overrides(spark={"extra": {"spark.hadoop.hive.metastore.uris": "thrift://metastore:9083"}})
    with pytest.raises(CatalogLocationError, match="shared beyond this lake"):
        ensure_database(spark, shared)
    ensure_database(spark, here)
    lake.upsert(spark, here, ITEMS, spark.createDataFrame([("i2", "sports", None, None, "s")], ITEMS.schema()))
    assert sorted(r.item_id for r in spark.table(name).collect()) == ["i1", "i2"]
    assert DeltaTable(str(here.lake.table_path("items"))).to_pandas()["item_id"].sort_values().tolist() == ["i1", "i2"]
    assert DeltaTable(str(orig.lake.table_path("items"))).to_pandas()["item_id"].tolist() == ["i1"]  # untouched
    runs = spark.sql(f"DESCRIBE TABLE EXTENDED {orig.lake.database}.ingest_runs").collect()
    assert str(orig.lake.table_path("ingest_runs")) in next(r.data_type for r in runs if r.col_name == "Location")
    # a copy of the copy: the entries now point into the first copy, not under the database's old root
    third = orig.with_overrides(lake={"root": str(tmp_path / "third")})
    shutil.copytree(here.lake.table_path("items"), third.lake.table_path("items"))
    ensure_database(spark, third)
    lake.upsert(spark, third, ITEMS, spark.createDataFrame([("i3", "arts", None, None, "s")], ITEMS.schema()))
    assert DeltaTable(str(third.lake.table_path("items"))).to_pandas()["item_id"].sort_values().tolist() == ["i1", "i2", "i3"]
    assert DeltaTable(str(here.lake.table_path("items"))).to_pandas()["item_id"].sort_values().tolist() == ["i1", "i2"]


@pytest.fixture
def dirty_log(tmp_path):
    good = [f"u{n},i{n % 5},{H0 + n * 60_000},1,0,3,1" for n in range(90)]  # 1.5 hours of clicks
    bad = {
        "u1,i1,1767571260000,1,0,3,1,EXTRA": "malformed record: wrong number of fields",
        ",i1,1767571260000,1,0,3,1": "missing user_id",
        "u2,,1767571260000,1,0,3,1": "missing item_id",
        "u3,i1,,1,0,3,1": "missing timestamp",
        "u4,i1,yesterday,1,0,3,1": "unparsable timestamp (ms): yesterday",
        "u5,i1,100,1,0,3,1": "timestamp looks like seconds read as milliseconds (before 1973-03-03; give --ts-unit s): 100",
        "u6,i1,5000000000000,1,0,3,1": "timestamp at or after max_ts 2100-01-01T00:00:00: 2128-06-11 08:53:20",
        good[3]: "duplicate click (same user, item, ts)",
    }
    path = tmp_path / "dirty.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join([HEADER] + good + list(bad)) + "\n")
    return path, good, bad


def test_every_bad_record_is_quarantined_with_its_reason(spark, make_cfg, dirty_log):
    path, good, bad = dirty_log
    cfg = make_cfg("click_dirty")
    report = ic.ingest(spark, cfg, str(path), spec(cfg))
    assert report.records_in == len(good) + len(bad)
    assert report.requests == len(good)
    assert report.quarantined == len(bad)
    q = table(spark, cfg, "request_log_quarantine").collect()
    reasons = sorted(f"{r.reason}: {r.value}" if r.value is not None else r.reason for r in q)
    assert reasons == sorted(bad.values())
    # the category alone, with the offending value in its own column, for GROUP BY reason
    assert {r.reason for r in q} == {v.split(": ")[0] for v in bad.values()}
    malformed = [r for r in q if r.reason.startswith("malformed")][0]
    assert malformed.raw == "u1,i1,1767571260000,1,0,3,1,EXTRA"  # the line itself, as read
    assert all(r.source == "clicklog" and r.input_path == str(path) for r in q)


def test_a_second_input_never_removes_the_rows_of_the_first(spark, make_cfg, tmp_path):
    """Two files of one source whose time ranges overlap: the first file's rows stay whole, the
    second's new clicks land beside them, a click both files hold is written once and quarantined
    for the second with the reason; rerunning the second (bad records and all) rewrites its rows and
    changes nothing."""
    cfg = make_cfg("click_overlap", clicklog={"negatives_per_click": 2, "pool_size": 20})
    first = [f"u{n % 7},i{n % 5},{H0 + n * 120_000},1,0,3,1" for n in range(60)]  # 00:00 .. 02:00
    shared = first[40:45]  # five clicks in both files
    second = shared + [f"v{n % 7},i{n % 5},{H0 + 90 * 60_000 + n * 60_000},1,0,3,1" for n in range(60)]  # 01:30 .. 02:30
    second += ["v1,i1,1767571260000,1,0,3,1,EXTRA", ",i1,1767571260000,1,0,3,1"]  # two bad records
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("\n".join([HEADER] + first) + "\n")
    b.write_text("\n".join([HEADER] + second) + "\n")
    names = ["request_log", "user_events", "request_log_quarantine", "ingest_runs"]

    def snapshot():
        out = {}
        for n in names:
            cols = [c for c in table(spark, cfg, n).columns if c not in ("ingested_at", "seconds", "finished_at")]
            out[n] = sorted(table(spark, cfg, n).select(cols).collect())
        return out

    ra = ic.ingest(spark, cfg, str(a), spec(cfg))
    rows_a = sorted(table(spark, cfg, "request_log").collect())
    rb = ic.ingest(spark, cfg, str(b), spec(cfg))
    assert (rb.records_in, rb.requests, rb.quarantined) == (67, 60, 7)
    assert rb.events_already_present == 5  # the shared clicks' events are there once, from the first file
    rl = table(spark, cfg, "request_log")
    assert sorted(rl.where(f"input_path = '{a}'").collect()) == rows_a  # the first file's rows, untouched
    assert rl.select("request_id").distinct().count() == ra.requests + rb.requests == 120
    assert rl.groupBy("request_id", "item_id").count().where("count > 1").count() == 0
    events = table(spark, cfg, "user_events")
    assert events.count() == 120 and events.where(f"input_path = '{a}'").count() == 60
    q = table(spark, cfg, "request_log_quarantine").where(f"input_path = '{b}'").collect()
    repeated = [r for r in q if r.reason == "request already ingested from another input"]
    assert len(q) == 7 and len(repeated) == 5
    assert sorted(json.loads(r.raw)["user_id"] for r in repeated) == sorted(line.split(",")[0] for line in shared)
    runs = {r.input_path: r for r in table(spark, cfg, "ingest_runs").collect()}
    assert (runs[str(a)].requests, runs[str(b)].requests, runs[str(b)].quarantined) == (60, 60, 7)

    before = snapshot()
    versions = {n: spark.sql(f"DESCRIBE HISTORY {cfg.lake.database}.{n}").count() for n in names}
    ic.ingest(spark, cfg, str(b), spec(cfg))
    assert snapshot() == before
    # the rerun did write (a new version), and replaced rather than appended
    assert all(spark.sql(f"DESCRIBE HISTORY {cfg.lake.database}.{n}").count() > versions[n] for n in names)


def test_input_errors_are_clear(spark, make_cfg, tmp_path):
    cfg = make_cfg("click_errors")
    with pytest.raises(ic.InputError, match="input path does not exist"):
        ic.ingest(spark, cfg, str(tmp_path / "missing.csv"), spec(cfg))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ic.InputError, match="CSV input is empty"):
        ic.ingest(spark, cfg, str(empty), spec(cfg))
    header_only = tmp_path / "header.csv"
    header_only.write_text(HEADER + "\n")
    with pytest.raises(ic.InputError, match="header but no records"):
        ic.ingest(spark, cfg, str(header_only), spec(cfg))
    wrong_cols = tmp_path / "wrong.csv"
    wrong_cols.write_text("uid,iid,when\nu1,i1,1767571260000\n")
    with pytest.raises(ic.InputError, match=r"lacks mapped column\(s\).*user_id.*it has \['uid', 'iid', 'when'\]"):
        ic.ingest(spark, cfg, str(wrong_cols), spec(cfg))
    # the same file reads fine once mapped
    report = ic.ingest(spark, cfg, str(wrong_cols), spec(cfg, map="user_id=uid,item_id=iid,ts=when"))
    assert report.requests == 1
    assert table(spark, cfg, "request_log").where("device IS NULL AND surface IS NULL").count() == 1


def test_bad_mapping_is_rejected(make_cfg):
    with pytest.raises(ic.InputError, match=r"mapping lacks \['item_id', 'ts'\]"):
        ic.ClickLogSpec(source="x", mapping={"user_id": "a"})
    with pytest.raises(ic.InputError, match="unknown mapped column"):
        ic.ClickLogSpec(source="x", mapping={"user_id": "a", "item_id": "b", "ts": "c", "colour": "d"})
    with pytest.raises(ic.InputError, match="ts_unit must be ms, s or iso"):
        ic.ClickLogSpec(source="x", mapping={"user_id": "a", "item_id": "b", "ts": "c"}, ts_unit="days")
    with pytest.raises(ic.InputError, match="look like solaris_col=input_col"):
        spec(make_cfg("click_map"), map="user_id")


def test_iso_and_second_timestamps(spark, make_cfg, tmp_path):
    cfg = make_cfg("click_units")
    iso = tmp_path / "iso.csv"
    iso.write_text("u,i,t\nu1,i1,2026-01-05T10:30:00\nu2,i1,2026-01-05 11:00:00\nu3,i1,not-a-time\n")
    report = ic.ingest(spark, cfg, str(iso), spec(cfg, map="user_id=u,item_id=i,ts=t", ts_unit="iso"))
    assert (report.requests, report.quarantined) == (2, 1)
    secs = tmp_path / "secs.parquet"
    import pandas as pd

    pd.DataFrame({"u": ["u1"], "i": ["i1"], "t": [1767607800]}).to_parquet(secs)
    report = ic.ingest(spark, cfg, str(secs), spec(cfg, map="user_id=u,item_id=i,ts=t", ts_unit="s"), fmt="parquet")
    assert report.requests == 1 and str(report.min_ts) == "2026-01-05 10:10:00"


@pytest.mark.real_data
def test_slice_of_real_globo(spark, make_cfg, shared_datasets, tmp_path):
    src = shared_datasets / "globo_news_clicks" / "clicks"
    files = [src / "clicks_hour_000.csv.gz", src / "clicks_hour_001.csv.gz"]
    n = sum(len(gzip.open(f, "rt").read().splitlines()) - 1 for f in files)
    folder = tmp_path / "globo"
    folder.mkdir()
    for f in files:
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = make_cfg("globo_real")
    report = ic.ingest(spark, cfg, str(folder / "*.csv.gz"), spec(cfg, "globo"))
    assert report.records_in == n
    assert report.requests + report.quarantined == n
    rl = table(spark, cfg, "request_log")
    assert rl.where("label = 1").count() == report.requests
    assert rl.where("device IS NULL OR referrer IS NULL").count() == 0  # context columns mapped


def test_the_leak_check_warns_outside_its_band_and_not_on_one_class():
    from datetime import datetime

    from include.config import QualityConfig
    from spark_jobs.ingest_load import IngestReport

    q = QualityConfig()
    assert q.leaks({"popularity_auc": 0.30, "recent_click_auc": 0.5, "position_auc": 0.5}) == ["prior popularity AUC 0.300"]
    assert q.leaks({"popularity_auc": 0.5, "recent_click_auc": 0.2, "position_auc": 0.8}) == \
        ["recent click AUC 0.200", "position AUC 0.800"]
    assert q.leaks({"popularity_auc": 0.45, "recent_click_auc": 0.6, "position_auc": 0.5}) == []
    nan = float("nan")
    assert q.leaks({"popularity_auc": nan, "recent_click_auc": nan, "position_auc": nan}) == []  # one class: nothing to judge
    assert QualityConfig(leak_auc_min=0.2).leaks({"popularity_auc": 0.30}) == []  # the band is the config's
    # the user's side is judged in the same band, and where only it leaks the default pool is not the advice
    user = q.leaks({"popularity_auc": 0.5, "same_category_auc": 0.95, "category_share_auc": 0.6, "interacted_before_auc": 0.3})
    assert user == ["same category as the last click AUC 0.950", "clicked by the user before AUC 0.300"]
    assert "--data impressions" in q.leak_advice([f"f.csv: {f}" for f in user]) and "default" not in q.leak_advice(user)
    assert "default [clicklog] pool" in q.leak_advice(["f.csv: recent click AUC 0.200", f"f.csv: {user[0]}"])
    base = dict(run_id="r", source="s", input_path="p", records_in=1, request_rows=1, requests=1, event_rows=1,
                item_rows=0, quarantined=0, min_ts=None, max_ts=None, seconds=0.0, finished_at=datetime(2026, 1, 1))
    lines = IngestReport(**base, popularity_auc=0.3, recent_click_auc=0.5, position_auc=0.5,
                         leaks=("prior popularity AUC 0.300",), candidates="generated").leak_lines()
    assert "recent click 0.500" in lines[0] and "not judged" not in lines[0]
    logged = IngestReport(**base, popularity_auc=0.7, recent_click_auc=0.5, position_auc=0.37, candidates="logged")
    assert [line for line in logged.leak_lines() if "WARNING" in line] == [] and "not judged" in logged.leak_lines()[0]
    assert [line for line in lines if "WARNING: prior popularity AUC 0.300" in line and "--allow-leaking-candidates" in line]
    assert IngestReport(**base).leak_lines() == []  # MIND: no generated candidates


@pytest.mark.parametrize("bounds", [dict(min_ts="2100-01-01T00:00:00"), dict(min_ts="yesterday"),
                                    dict(leak_auc_min=0.6), dict(leak_auc_max=0.4)])
def test_bad_quality_bounds_are_refused(bounds):
    from include.config import ConfigError, QualityConfig

    with pytest.raises(ConfigError):
        QualityConfig(**bounds)


def test_hostile_input_is_quarantined_or_refused_in_one_line(spark, make_cfg, tmp_path):
    """An overflowing timestamp, a line of 25,000 fields, Latin-1 bytes in a UTF-8 read, over-long or
    control-character ids and whitespace-only lines each land in the quarantine with a reason
    (the good rows beside them land too); a truncated gzip and a UTF-16 file are one clear error."""
    cfg = make_cfg("click_hostile")
    good = [f"u{n},i{n % 5},{H0 + n * 60_000},1,0,3,1" for n in range(20)]
    lines = [HEADER, *good, "u90,i1,9223372036854775807,1,0,3,1", "u91,i1,1767571200000" + ",x" * 25_000,
             "   ", "", "u" * 300 + ",i1,1767571260000,1,0,3,1", "u\x07bell,i1,1767571260000,1,0,3,1"]
    path = tmp_path / "hostile.csv"
    path.write_bytes("\n".join(lines).encode() + b"\ncaf\xe9,i1,1767571260000,1,0,3,1\ncaf\xe8,i1,1767571260000,1,0,3,1\n")
    report = ic.ingest(spark, cfg, str(path), spec(cfg))
    assert (report.records_in, report.requests) == (28, 20)
    assert dict(report.reasons) == {"unparsable timestamp (ms)": 1, "malformed record": 1, "blank line": 2,
                                    "user_id over 256 characters": 1, "user_id holds a control character": 1,
                                    "undecodable bytes": 2}
    q = {r.reason: r for r in table(spark, cfg, "request_log_quarantine").collect()}
    assert q["unparsable timestamp (ms)"].value == "9223372036854775807"
    assert q["malformed record"].raw.startswith("u91,i1,1767571200000,x,x")  # the line itself
    assert table(spark, cfg, "request_log").where("user_id LIKE 'caf%'").count() == 0  # no false duplicate
    gz = tmp_path / "cut.csv.gz"
    whole = gzip.compress(("\n".join([HEADER, *good * 50]) + "\n").encode())
    gz.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(ic.InputError, match="cut.csv.gz: cannot be read as csv: .*Unexpected end of input stream"):
        ic.ingest(spark, cfg, str(gz), spec(cfg))
    utf16 = tmp_path / "utf16.csv"
    utf16.write_bytes(("\n".join([HEADER, *(g.replace("u", "w", 1) for g in good)]) + "\n").encode("utf-16"))
    with pytest.raises(ic.InputError, match="not utf-8 text .*--encoding"):
        ic.ingest(spark, cfg, str(utf16), spec(cfg))
    report = ic.ingest(spark, cfg, str(utf16), spec(cfg, encoding="utf-16"))  # told the encoding, it reads
    assert (report.requests, report.quarantined) == (20, 0)


def test_records_not_lines_a_literal_replacement_character_and_a_line_too_wide_to_parse(spark, make_cfg, tmp_path):
    """A quoted field holding a newline is one record (not a quarantined half and an invented
    click); U+FFFD written as text is text (only a file with bytes that are not UTF-8 has its
    U+FFFD records quarantined); a line of more fields than the parser can hold is quarantined
    alone and the good rows of its file land."""
    from spark_jobs.raw_input import MAX_FIELDS, WIDE_LINE

    cfg = make_cfg("click_records")
    good = [f"u{n},i{n % 5},{H0 + n * 60_000},1,0,3,1" for n in range(6)]
    quoted = f'u7,i1,{H0 + 600_000},"home\npage",0,3,1'
    replacement = f"u8,i2,{H0 + 660_000},caf\ufffd,0,3,1"
    path = tmp_path / "records.csv"
    path.write_text("\n".join([HEADER, *good[:3], quoted, replacement, *good[3:]]) + "\n", encoding="utf-8")
    report = ic.ingest(spark, cfg, str(path), spec(cfg))
    assert (report.records_in, report.requests, report.quarantined) == (8, 8, 0)
    clicks = {r.user_id: r for r in table(spark, cfg, "request_log").where("label = 1").collect()}
    assert clicks["u7"].surface == "home\npage" and clicks["u8"].surface == "caf\ufffd"
    assert not any(u.startswith("page") for u in clicks)

    wide = tmp_path / "wide.csv"
    later = [g.replace("u", "w", 1) for g in good]
    wide.write_text("\n".join([HEADER, *later[:3], "w9,i1" + "," * MAX_FIELDS, *later[3:]]) + "\n")
    report = ic.ingest(spark, cfg, str(wide), spec(cfg, source="wide"))
    assert (report.records_in, report.requests, dict(report.reasons)) == (7, 6, {WIDE_LINE: 1})
    q = table(spark, cfg, "request_log_quarantine").where("source = 'wide'").collect()
    assert len(q) == 1 and q[0].raw.startswith("w9,i1,,,") and len(q[0].raw) == len("w9,i1") + MAX_FIELDS


def test_a_quarantined_record_s_raw_text_parses_back_to_the_same_fields(spark, make_cfg, tmp_path):
    """The quarantine keeps each record as a CSV line: the header and the quarantined lines, read
    by the same reader, give back the fields as they were read (spaces and quoted commas too)."""
    from spark_jobs.raw_input import data_columns, read_raw

    cfg = make_cfg("click_raw")
    bad = [' u1 ,i1,not-a-time,"home, page",0,3,1', f'u2,,{H0},web,"a ""b""",3,1', f"u3,i3,{H0},,,,"]
    good = [f"u{n},i{n},{H0 + n * 60_000},1,0,3,1" for n in range(4, 8)]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([HEADER, *good, *bad]) + "\n")
    ic.ingest(spark, cfg, str(path), spec(cfg))
    raws = [r.raw for r in table(spark, cfg, "request_log_quarantine").collect()]
    assert len(raws) == 2  # u3 has no context: it is good

    def fields(p):
        records = read_raw(spark, str(p), "csv").records
        return sorted(tuple(r[c] for c in data_columns(records)) for r in records.collect())

    again = tmp_path / "again.csv"
    again.write_text("\n".join([HEADER, *raws]) + "\n")
    original = tmp_path / "original.csv"
    original.write_text("\n".join([HEADER, *bad[:2]]) + "\n")
    assert fields(again) == fields(original)
    assert (" u1 ", "i1", "not-a-time", "home, page", "0", "3", "1") in fields(again)
