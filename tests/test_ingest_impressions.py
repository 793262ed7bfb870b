"""Impression-log ingestion: the synthetic world lands whole (requests, clicks, items, truth),
every bad record is quarantined with its reason, reruns change nothing, and a log quarantined
whole for one reason says what to try."""

import pytest

from include import synthetic_world as sw
from spark_jobs import ingest_impressions as ii
from spark_jobs.ingest import ingest

pytestmark = pytest.mark.spark

HEADER = "request_id,user_id,item_id,ts,position,label,conversion,surface,device,region,referrer"
H0 = 1767571200000  # 2026-01-05T00:00:00Z in ms


def table(spark, cfg, name):
    return spark.table(f"{cfg.lake.database}.{name}")


def test_the_synthetic_world_lands_whole(spark, make_cfg, tmp_path):
    cfg = make_cfg("imp_world")
    world = sw.generate(sw.WorldConfig(users=80, items=40, hours=4, visits_per_hour=15, shown=4))
    sw.write(world, tmp_path / "w")
    report = ingest(spark, cfg, "synthetic", str(tmp_path / "w"))
    im = world["impressions"]
    n, clicks = len(im["ts"]), int(im["label"].sum())
    assert (report.records_in, report.quarantined, report.request_rows) == (n, 0, n)
    assert report.requests == len(set(im["request_id"])) and report.item_rows == 40
    rl = table(spark, cfg, "request_log")
    assert rl.where("label = 1").count() == clicks and rl.where("conversion = 1").count() == int(im["conversion"].sum())
    assert rl.where("request_id NOT LIKE 'synthetic:r%'").count() == 0
    assert table(spark, cfg, "user_events").where("event_type = 'click'").count() == clicks
    truth = table(spark, cfg, "truth")
    assert truth.count() == n and truth.join(rl, ["request_id", "item_id"], "left_anti").count() == 0
    assert 0 < report.position_auc < 1  # the leak check runs on impression logs too


def test_every_bad_record_is_quarantined_with_its_reason_and_a_rerun_changes_nothing(spark, make_cfg, tmp_path):
    cfg = make_cfg("imp_bad")
    good = [f"r{n // 3},u{n // 3},i{n % 3},{H0 + (n // 3) * 60_000},{n % 3},{int(n % 3 == 0)},0,1,0,3,1"
            for n in range(30)]
    bad = {
        "missing user_id": "r90,,i1,1767571200000,0,1,0,1,0,3,1",
        "label not 0, 1 or empty": "r91,u1,i1,1767571200000,0,2,0,1,0,3,1",
        "conversion without a click": "r92,u1,i1,1767571200000,0,0,1,1,0,3,1",
        "position not a non-negative integer": "r93,u1,i1,1767571200000,-1,0,0,1,0,3,1",
        "unparsable timestamp (ms)": "r94,u1,i1,yesterday,0,0,0,1,0,3,1",
        "malformed record: wrong number of fields": "r95,u1,i1,1767571200000,0,0,0,1,0,3,1,EXTRA",
    }
    disagree = ["r96,u1,i1,1767571200000,0,0,0,1,0,3,1", "r96,u2,i2,1767571200000,1,0,0,1,0,3,1"]
    repeat = ["r97,u1,i1,1767571200000,0,0,0,1,0,3,1", "r97,u1,i1,1767571200000,1,1,0,1,0,3,1"]
    path = tmp_path / "imp.csv"
    path.write_text("\n".join([HEADER, *good, *bad.values(), *disagree, *repeat]) + "\n")
    spec = ii.spec_from_args(ii.parse_args(["--input", str(path)]))
    report = ii.ingest(spark, cfg, str(path), spec)
    assert (report.records_in, report.request_rows, report.quarantined) == (40, 31, 9), report.reasons
    reasons = dict(report.reasons)
    for reason in bad:
        assert reasons.get(reason.split(": ")[0]) == 1, (reason, reasons)  # counted by category
    assert reasons["request rows disagree on the user or the time"] == 2 and reasons["repeated item in request"] == 1
    assert table(spark, cfg, "request_log").where("request_id = 'impressions:r97'").count() == 1
    cols = ["raw", "reason"]
    before = sorted(table(spark, cfg, "request_log_quarantine").select(cols).collect())
    rows = sorted(table(spark, cfg, "request_log").drop("ingested_at").collect())
    ii.ingest(spark, cfg, str(path), spec)
    assert sorted(table(spark, cfg, "request_log_quarantine").select(cols).collect()) == before
    assert sorted(table(spark, cfg, "request_log").drop("ingested_at").collect()) == rows


def test_a_log_quarantined_whole_for_one_reason_says_what_to_try(spark, make_cfg, tmp_path):
    cfg = make_cfg("imp_secs")
    path = tmp_path / "secs.csv"
    path.write_text(HEADER + "\n" + "\n".join(f"r{n},u{n},i{n},{1767571200 + n},0,0,0,1,0,3,1" for n in range(5)) + "\n")
    report = ii.ingest(spark, cfg, str(path), ii.spec_from_args(ii.parse_args(["--input", str(path)])))
    assert report.quarantined == 5 and report.request_rows == 0
    lines = "\n".join(report.lines(cfg.lake.database))
    assert "every record was quarantined as 'timestamp looks like seconds read as milliseconds" in lines
    assert "try --ts-unit s" in lines
    # The fix it names, through the dispatcher every entry point ingests with (model_eval's --ts-unit).
    fixed = ingest(spark, cfg, "impressions", str(path), ["--ts-unit", "s"])
    assert (fixed.request_rows, fixed.quarantined) == (5, 0)
    assert str(table(spark, cfg, "request_log").agg({"ts": "min"}).first()[0]) == "2026-01-05 00:00:00"


def test_missing_columns_and_bad_items_are_clear(spark, make_cfg, tmp_path):
    cfg = make_cfg("imp_cols")
    path = tmp_path / "nolabel.csv"
    path.write_text("request_id,user_id,item_id,ts\nr1,u1,i1,1767571200000\n")
    with pytest.raises(ii.InputError, match=r"lacks mapped column\(s\) \[\"label \(from column 'label'\)\"\]"):
        ii.ingest(spark, cfg, str(path), ii.spec_from_args(ii.parse_args(["--input", str(path)])))
    log, items = tmp_path / "ok.csv", tmp_path / "items.csv"
    log.write_text(HEADER + "\nr1,u1,i1,1767571200000,0,1,0,1,0,3,1\n")
    items.write_text("item_id,category,subcategory\ni1,news,n1\n,sport,s1\ni1,sport,s2\n")
    report = ii.ingest(spark, cfg, str(log), ii.spec_from_args(ii.parse_args(["--input", str(log)])), items_path=str(items))
    assert report.item_rows == 1 and dict(report.reasons) == {"missing item_id": 1, "repeated item_id in item file": 1}
    assert [(r.item_id, r.category) for r in table(spark, cfg, "items").collect()] == [("i1", "news")]


def test_float_labels_are_read_and_other_label_values_are_quarantined_not_nulled(spark, make_cfg, tmp_path):
    """A label column written as floats (1.0 / 0.0) is the same log; NaN, true, inf or 2 are not a
    label and go to the quarantine with their value, never to a NULL label that drops the click."""
    cfg = make_cfg("imp_float_labels")
    good = [f"f{n // 2},u{n // 2},i{n % 2},{H0 + (n // 2) * 60_000},{n % 2},{float(n % 2 == 0)},,1,0,3,1" for n in range(8)]
    odd = {"NaN": "g1,u1,i1,1767571200000,0,NaN,,1,0,3,1", "true": "g2,u1,i1,1767571200000,0,true,,1,0,3,1",
           "inf": "g3,u1,i1,1767571200000,0,inf,,1,0,3,1", "1.5": "g4,u1,i1,1767571200000,0,1.5,,1,0,3,1",
           "conv": "g5,u1,i1,1767571200000,0,1.0,NaN,1,0,3,1"}
    path = tmp_path / "floats.csv"
    path.write_text("\n".join([HEADER, *good, *odd.values()]) + "\n")
    report = ii.ingest(spark, cfg, str(path), ii.spec_from_args(ii.parse_args(["--input", str(path)])))
    assert (report.request_rows, report.quarantined) == (8, 5), report.reasons
    rl = table(spark, cfg, "request_log")
    assert rl.where("label IS NULL").count() == 0 and rl.where("label = 1").count() == 4
    assert table(spark, cfg, "user_events").where("event_type = 'click'").count() == 4
    q = {(r["reason"], r["value"]) for r in table(spark, cfg, "request_log_quarantine").collect()}
    assert q == {*(("label not 0, 1 or empty", v) for v in ("NaN", "true", "inf", "1.5")),
                 ("conversion not 0, 1 or empty", "NaN")}, q


def test_a_request_id_reused_by_another_file_is_quarantined_and_a_source_with_a_colon_refused(spark, make_cfg, tmp_path):
    """Request ids are stored as "<source>:<id>". The same id in another file, at another time and
    for another user, is a different request: it is quarantined with who holds the id, never
    written under two users. A source name with ':' could make two requests one id: refused."""
    cfg = make_cfg("imp_reused_ids")
    first, second = tmp_path / "day1.csv", tmp_path / "day2.csv"
    first.write_text("\n".join([HEADER, f"r1,u1,i1,{H0},0,1,,1,0,3,1", f"r1,u1,i2,{H0},1,0,,1,0,3,1",
                                f"r2,u2,i1,{H0 + 60_000},0,0,,1,0,3,1"]) + "\n")
    day2 = H0 + 86_400_000 * 3  # three days later, far outside the first file's time range
    second.write_text("\n".join([HEADER, f"r1,u9,i3,{day2},0,1,,1,0,3,1", f"r3,u3,i1,{day2},0,1,,1,0,3,1"]) + "\n")
    for path in (first, second):
        ii.ingest(spark, cfg, str(path), ii.spec_from_args(ii.parse_args(["--input", str(path)])))
    users = {r.user_id for r in table(spark, cfg, "request_log").where("request_id = 'impressions:r1'").collect()}
    assert users == {"u1"}
    q = [(r.reason, r.value) for r in table(spark, cfg, "request_log_quarantine").collect()]
    assert len(q) == 1 and q[0][0] == "request_id already used by another request of this source"
    assert "has it for user u1 at 2026-01-05 00:00:00" in q[0][1] and "day1.csv" in q[0][1]
    with pytest.raises(ii.InputError, match="source name 'a:b' is not usable"):
        ii.ingest(spark, cfg, str(second), ii.spec_from_args(ii.parse_args(["--input", str(second), "--source", "a:b"])))


def test_a_request_of_too_many_candidates_is_quarantined_not_the_file(spark, make_cfg, tmp_path):
    """One request of 501 candidates (above [quality] max_candidates_per_request) once failed the
    whole file's quality check with a traceback; it is quarantined whole and the rest lands."""
    cfg = make_cfg("imp_too_many_candidates")
    big = [f"big,u1,i{n},{H0},{n},{int(n == 0)},,1,0,3,1" for n in range(501)]
    small = [f"ok,u2,i{n},{H0 + 60_000},{n},{int(n == 1)},,1,0,3,1" for n in range(3)]
    path = tmp_path / "big.csv"
    path.write_text("\n".join([HEADER, *big, *small]) + "\n")
    report = ii.ingest(spark, cfg, str(path), ii.spec_from_args(ii.parse_args(["--input", str(path)])))
    assert (report.request_rows, report.quarantined) == (3, 501)
    reasons = {(r.reason, r.value) for r in table(spark, cfg, "request_log_quarantine").collect()}
    assert reasons == {("request of more than 500 candidates ([quality] max_candidates_per_request)", "501")}


def test_a_repeated_candidate_keeps_its_click(spark, make_cfg, tmp_path):
    """The same (request, item) twice with conflicting labels: the click is kept, the other row is
    quarantined as the repeat (whichever order the file has them in)."""
    cfg = make_cfg("imp_repeat_keeps_click")
    path = tmp_path / "repeat.csv"
    path.write_text("\n".join([HEADER, f"a,u1,i1,{H0},0,0,,1,0,3,1", f"a,u1,i1,{H0},0,1,,1,0,3,1",
                                f"b,u2,i1,{H0},0,1,,1,0,3,1", f"b,u2,i1,{H0},0,0,,1,0,3,1"]) + "\n")
    report = ii.ingest(spark, cfg, str(path), ii.spec_from_args(ii.parse_args(["--input", str(path)])))
    assert (report.request_rows, report.quarantined) == (2, 2)
    assert sorted(r.label for r in table(spark, cfg, "request_log").collect()) == [1, 1]
