"""MIND ingestion: parsing, labels, history placement, items, quarantine reasons, idempotency."""

from datetime import datetime, timedelta

import pytest

from include.spark import ensure_database
from spark_jobs import ingest_mind
from spark_jobs.ingest_clicklog import InputError
from tests.conftest import DATA

pytestmark = pytest.mark.spark

BEHAVIORS, NEWS = str(DATA / "mind" / "behaviors.tsv"), str(DATA / "mind" / "news.tsv")


def table(spark, cfg, name):
    return spark.table(f"{cfg.lake.database}.{name}")


@pytest.fixture(scope="module")
def mind(spark, lake_root):
    """The fixture log ingested once into its own database."""
    from tests.conftest import _test_config

    cfg = _test_config(lake_root / "mind", database="t_mind")
    ensure_database(spark, cfg)
    report = ingest_mind.ingest(spark, cfg, BEHAVIORS, NEWS)
    return cfg, report


def test_counts_land_where_expected(spark, mind):
    cfg, report = mind
    assert report.records_in == 9
    assert report.requests == 3 and report.request_rows == 7
    assert report.quarantined == 7  # six behaviors lines and one news line
    assert report.item_rows == 2
    assert table(spark, cfg, "request_log").count() == 7


def test_candidates_labels_and_partitions(spark, mind):
    cfg, _ = mind
    rows = {(r.request_id, r.position): r for r in table(spark, cfg, "request_log").collect()}
    assert [(rows[("mind:1", p)].item_id, rows[("mind:1", p)].label) for p in range(3)] == \
        [("N10", 1), ("N11", 0), ("N12", 0)]
    assert [rows[("mind:3", p)].label for p in range(2)] == [None, None]  # test-split tokens: label unknown
    r = rows[("mind:1", 0)]
    assert r.ts == datetime(2019, 11, 12, 14, 14, 46) and r.user_id == "U1"
    assert (str(r.date), r.hour) == ("2019-11-12", 14)


def test_history_is_placed_before_the_first_request(spark, mind):
    cfg, _ = mind
    ev = table(spark, cfg, "user_events").collect()
    start = datetime(2019, 11, 12, 14, 14, 46)
    hist = sorted((r.ts, r.item_id) for r in ev if r.event_type == "history")
    assert hist == [(start - timedelta(seconds=3), "N1"), (start - timedelta(seconds=2), "N2"),
                    (start - timedelta(seconds=1), "N3")]
    clicks = sorted((r.user_id, r.item_id) for r in ev if r.event_type == "click")
    assert clicks == [("U1", "N10"), ("U2", "N13")]


def test_every_bad_line_is_quarantined_with_its_reason(spark, mind):
    cfg, _ = mind
    q = {r.raw.split("\t")[0]: f"{r.reason}: {r.value}" if r.value is not None else r.reason
         for r in table(spark, cfg, "request_log_quarantine").collect()}
    assert q["4"].startswith("malformed line: expected 5 tab-separated fields, got 4")
    assert q["5"].startswith("unparsable time")
    assert q["6"].startswith("malformed candidate token")
    assert q["1"] == "repeated impression_id"
    assert q["8"] == "missing user_id"
    assert q["9"] == "repeated candidate in impression"
    assert q["N99"].startswith("malformed news line")


def test_ingest_twice_leaves_the_same_tables(spark, mind):
    cfg, _ = mind
    names = ["request_log", "user_events", "items", "request_log_quarantine"]
    cols = {n: [c for c in table(spark, cfg, n).columns if c != "ingested_at"] for n in names}
    before = {n: sorted(table(spark, cfg, n).select(cols[n]).collect()) for n in names}
    ingest_mind.ingest(spark, cfg, BEHAVIORS, NEWS)
    after = {n: sorted(table(spark, cfg, n).select(cols[n]).collect()) for n in names}
    assert after == before
    assert table(spark, cfg, "ingest_runs").count() == 1


def test_missing_path_and_empty_file_are_clear_errors(spark, make_cfg, tmp_path):
    cfg = make_cfg("mind_bad")
    with pytest.raises(InputError, match="input path does not exist"):
        ingest_mind.ingest(spark, cfg, str(tmp_path / "nope.tsv"))
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(InputError, match="no impression lines"):
        ingest_mind.ingest(spark, cfg, str(empty))


@pytest.mark.real_data
def test_slice_of_real_mind(spark, make_cfg, shared_datasets, tmp_path):
    lines = (shared_datasets / "mind_small_subset" / "behaviors.tsv").read_text().splitlines()[:200]
    f = tmp_path / "behaviors.tsv"
    f.write_text("\n".join(lines) + "\n")
    cfg = make_cfg("mind_real")
    report = ingest_mind.ingest(spark, cfg, str(f), str(shared_datasets / "mind_small_subset" / "news.tsv"))
    expected_rows = sum(len(ln.split("\t")[4].split()) for ln in lines)
    expected_clicks = sum(tok.endswith("-1") for ln in lines for tok in ln.split("\t")[4].split())
    assert report.quarantined == 0
    assert (report.requests, report.request_rows) == (200, expected_rows)
    assert table(spark, cfg, "request_log").where("label = 1").count() == expected_clicks
    assert report.item_rows == 2000
