"""The replay evaluation at small scale, through the real jobs: tiers sum to 1, nothing served at t
depends on anything after t, expired embeddings are never served, misses are queued and taken in,
the report is written, and the variants are deterministic given the seed."""

import json
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from deltalake import DeltaTable

from feature_store.resolution import TIERS
from model import data as mdata
from experiments import replay_eval
from model import registry
from model.autoencoder import AEConfig, EmbeddingAutoencoder
from model.features import Vocab
from model.fm import FMConfig, FoundationModel
from model.train import TrainConfig
from experiments import coverage_sweep, replay, replay_report
from tests.conftest import ROOT
from tests.conftest import TINY, copy_lake

pytestmark = pytest.mark.spark

# the synthetic log runs 2026-01-05 00:00 .. 12:00; models train before 05:00
# (the shortest window: cycles at 06:00, 07:00 and 08:00; VM variants train on [06:00, 07:00) and test on [07:00, 08:00))
WINDOW = replay.ReplayWindow(datetime(2026, 1, 5, 6), datetime(2026, 1, 5, 8), datetime(2026, 1, 5, 7),
                             datetime(2026, 1, 5, 7))
# The ablation of code vintages on the item-mean rows: this tiny world's exact test rows hold no click
EVAL = replay_eval.ReplayEvalConfig(vm_train=TrainConfig(epochs=2, batch_size=256), seeds=(7, 8),
                                    ablation_tier="item_mean")
MAIN, SHORT = "budget0.3_ttl6h", "budget0.3_ttl0.5h"  # 0.5 h: embeddings expire inside the hour they serve


@pytest.fixture(scope="module")
def replayed(spark, lake_root, base_lake, tmp_path_factory):
    from tests.conftest import _test_config

    cfg = _test_config(lake_root / "replay", database="t_replay").with_overrides(
        precompute={"lookback_hours": 3, "trending_items": 5, "recent_items_per_user": 5,
                    "budget": 0.3, "ttl_hours": 6.0},
        fallback={"neighbors_k": 3, "recall_sample": 50},
        models={"device": "cpu", "consumers": [{"name": "click"}, {"name": "cvr", "task": "conversion", "surface": "1"}]})
    copy_lake(spark, base_lake, cfg, models=False)  # the replay trains its own, before its window
    result = replay.run(spark, cfg, "synthetic", WINDOW, [0.3], [0.5, 6.0], TINY, EVAL, log=lambda *_: None)
    out = replay_report.write(result, tmp_path_factory.mktemp("reports") / "replay_synthetic")
    return cfg, result, out


def naive(text) -> pd.Timestamp:
    t = pd.Timestamp(text)
    return t.tz_convert(None) if t.tzinfo else t


def point_cfg(cfg, name):
    p = {MAIN: coverage_sweep.SweepPoint(0.3, 6.0), SHORT: coverage_sweep.SweepPoint(0.3, 0.5)}[name]
    return coverage_sweep.point_config(cfg, p, folder="replay", tag="replay")


def served(pcfg) -> pd.DataFrame:
    df = DeltaTable(str(pcfg.lake.table_path("request_features"))).to_pandas()
    return df.assign(ts=mdata.utc_naive(df["ts"]))


def test_every_hour_of_the_replay_is_served_once_and_tiers_sum_to_one(replayed):
    cfg, result, _ = replayed
    assert set(result["points"]) == {MAIN, SHORT}
    log = DeltaTable(str(cfg.lake.table_path("request_log"))).to_pandas()
    log = log.assign(ts=mdata.utc_naive(log["ts"]))
    expected = log[(log["ts"] >= WINDOW.start - timedelta(hours=1)) & (log["ts"] < WINDOW.end)]
    for name, p in result["points"].items():
        rows = served(point_cfg(cfg, name))
        assert len(rows) == len(expected) and not rows.duplicated(["request_id", "item_id"]).any()
        assert set(rows["tier"]) <= set(TIERS)
        assert sum(p["coverage"].values()) == pytest.approx(1.0)
        measured = rows[rows["ts"] >= WINDOW.measure_from]
        for t in TIERS:
            assert p["coverage"].get(t, 0.0) == pytest.approx((measured["tier"] == t).mean())
        assert [h["hour"] for h in p["hourly"]] == [WINDOW.start + timedelta(hours=h) for h in range(-1, 2)]
        assert sum(sum(h[t] for t in TIERS) for h in p["hourly"]) == len(rows)
        assert len(p["cycles"]) == 3
    shares = [t["share"] for t in result["variants"]["by_tier"]]
    assert sum(shares) == pytest.approx(1.0)


def test_nothing_served_at_t_depends_on_anything_after_t(replayed):
    cfg, result, _ = replayed
    # the models were trained, validated and tested on requests before the replay's first hour
    for split in result["initial_models"]["window"].values():
        if isinstance(split, dict):
            assert naive(split["to"]) < pd.Timestamp(WINDOW.train_until)
    for name in (MAIN, SHORT):
        pcfg = point_cfg(cfg, name)
        rows = served(pcfg)
        pubs = DeltaTable(str(pcfg.lake.table_path("feature_versions"))).to_pandas()
        pubs["interval_end"] = mdata.utc_naive(pubs["interval_end"])
        rows = rows.merge(pubs, left_on="snapshot_run_id", right_on="run_id", how="left")
        never = rows["snapshot_run_id"].isna()
        assert (rows.loc[never, "tier"] == "none").all()
        assert (rows.loc[never, "ts"] < WINDOW.start).all()  # only the hour before the first publication
        assert (rows.loc[~never, "interval_end"] <= rows.loc[~never, "ts"]).all()
        # and each request read the newest snapshot published at or before it, not an older one
        newest = np.searchsorted(np.sort(pubs["interval_end"].to_numpy()), rows.loc[~never, "ts"].to_numpy(),
                                 side="right") - 1
        assert (np.sort(pubs["interval_end"].to_numpy())[newest] == rows.loc[~never, "interval_end"].to_numpy()).all()


def _at_version(pcfg, table, version):
    df = DeltaTable(str(pcfg.lake.table_path(table)), version=int(version)).to_pandas()
    return df.assign(computed_at=mdata.utc_naive(df["computed_at"]), expires_at=mdata.utc_naive(df["expires_at"]))


@pytest.mark.parametrize("name", [MAIN, SHORT])
def test_exact_and_mean_embeddings_were_computed_before_and_valid_at_serving(replayed, name):
    """Every exact / item-mean / user-mean embedding served is the row of its snapshot (read here by Delta
    version) with computed_at <= ts < expires_at; with a 0.5 h TTL some requested pairs were in
    the snapshot but expired, and they were not served as exact."""
    cfg, _, _ = replayed
    pcfg = point_cfg(cfg, name)
    rows = served(pcfg)
    pubs = DeltaTable(str(pcfg.lake.table_path("feature_versions"))).to_pandas()
    checked = {"exact": 0, "user_mean": 0, "item_mean": 0, "expired_not_served": 0}
    for _, pub in pubs.iterrows():
        mine = rows[rows["snapshot_run_id"] == pub["run_id"]]
        pairs = _at_version(pcfg, "pair_embeddings", pub["pair_embeddings_version"])
        got = mine.merge(pairs, on=["user_id", "item_id"], how="left", suffixes=("", "_stored"))
        exact = got[got["tier"] == "exact"]
        assert exact["embedding_stored"].notna().all()
        assert ((exact["computed_at"] <= exact["ts"]) & (exact["ts"] < exact["expires_at"])).all()
        for a, b in zip(exact["embedding"], exact["embedding_stored"]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        expired = got[got["expires_at"].notna() & (got["expires_at"] <= got["ts"])]
        assert (expired["tier"] != "exact").all()
        checked["exact"] += len(exact)
        checked["expired_not_served"] += len(expired)
        means = _at_version(pcfg, "user_mean_embeddings", pub["user_mean_embeddings_version"])
        um = mine[mine["tier"] == "user_mean"].merge(means, on="user_id", how="left", suffixes=("", "_stored"))
        assert ((um["computed_at"] <= um["ts"]) & (um["ts"] < um["expires_at"])).all()
        for a, b in zip(um["embedding"], um["embedding_stored"]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
        checked["user_mean"] += len(um)
        version = pub.get("item_mean_embeddings_version")
        items = _at_version(pcfg, "item_mean_embeddings", version) if pd.notna(version) else None
        im = mine[mine["tier"] == "item_mean"]
        if len(im):
            im = im.merge(items, on="item_id", how="left", suffixes=("", "_stored"))
            assert ((im["computed_at"] <= im["ts"]) & (im["ts"] < im["expires_at"])).all()
            for a, b in zip(im["embedding"], im["embedding_stored"]):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
        checked["item_mean"] += len(im)
    assert checked["exact"] > 0 and checked["item_mean"] > 0
    if name == SHORT:
        assert checked["expired_not_served"] > 0, "the 0.5 h TTL should leave expired pairs in some snapshot"


def test_an_exact_code_served_right_after_its_run_is_the_fm_as_of_that_run(replayed):
    """A pair precomputed at a run t and requested in [t, t + 1 h) is served the code that the FM and
    autoencoder give for that pair recomputed here as of t, with the context precompute guessed
    (the user's latest device and surface, logged in verifier_scores), to float tolerance."""
    from model.features import build_examples
    from model.train import infer

    cfg, result, _ = replayed
    pcfg = point_cfg(cfg, MAIN)
    models = result["initial_models"]["models"]
    fm = registry.load(Path(models["fm"]), FoundationModel, FMConfig)
    ae = registry.load(Path(models["autoencoder"]), EmbeddingAutoencoder, AEConfig)
    vocab = Vocab.load(Path(models["fm"]) / "vocab.json")
    rows = served(pcfg)
    pubs = DeltaTable(str(pcfg.lake.table_path("feature_versions"))).to_pandas()
    scores = DeltaTable(str(pcfg.lake.table_path("verifier_scores"))).to_pandas()
    events, items = mdata.events_and_items(cfg, "synthetic")
    compared = 0
    for _, pub in pubs.iterrows():
        t = naive(pub["interval_end"])
        pairs = _at_version(pcfg, "pair_embeddings", pub["pair_embeddings_version"])
        mine = rows[(rows["snapshot_run_id"] == pub["run_id"]) & (rows["tier"] == "exact")
                    & (rows["ts"] < t + pd.Timedelta(hours=1))]
        mine = mine.merge(pairs[pairs["computed_at"] == t][["user_id", "item_id"]], on=["user_id", "item_id"])
        mine = mine.drop_duplicates(["user_id", "item_id"]).merge(
            scores[scores["run_id"] == pub["run_id"]][["user_id", "item_id", "device", "surface"]],
            on=["user_id", "item_id"], validate="one_to_one")
        if mine.empty:
            continue
        req = mine[["user_id", "item_id", "device", "surface"]].assign(ts=t, label=0, position=None)
        x = build_examples(req, events, vocab, fm.cfg.history_len, items, fm.cfg.horizon_hours, group_by="user_id")
        ae.eval()
        codes = infer(lambda b: ae.encode(fm.embed(b)), fm, x)
        np.testing.assert_allclose(np.stack(mine["embedding"].map(np.asarray)), codes, atol=1e-4, rtol=1e-4)
        compared += len(mine)
    assert compared > 0


def test_misses_are_queued_and_taken_in_by_later_cycles(replayed):
    cfg, result, _ = replayed
    p = result["points"][MAIN]
    q = DeltaTable(str(point_cfg(cfg, MAIN).lake.table_path("miss_queue"))).to_pandas()
    rows = served(point_cfg(cfg, MAIN))
    missed = rows[rows["tier"] != "exact"]
    assert set(q["origin"]) == {"replay"} and len(q) == len(missed.drop_duplicates(["user_id", "item_id", "ts"]))
    taken = DeltaTable(str(point_cfg(cfg, MAIN).lake.table_path("miss_consumption"))).to_pandas()
    assert p["miss_queue"]["replay"]["pairs"] == len(q) and len(taken) > 0 and q["consumed_by_run"].isna().all()
    assert p["miss_queue"]["replay"]["consumed"] == len(taken)
    assert sum(c["queue_in"] for c in p["cycles"][1:]) > 0


def test_variants_report_and_plots(replayed):
    _, result, out = replayed
    v = result["variants"]
    assert [r["model"] for r in v["rows"]] == list(replay_eval.VARIANTS)
    for r in v["rows"]:
        assert np.isfinite(r["ne"]) and 0 <= r["auc"] <= 1 and r["examples"] == v["window"]["test"]["rows"]
    assert {p["point"] for p in v["by_point"]} == {MAIN, SHORT}
    assert next(p for p in v["by_point"] if p["point"] == MAIN)["ne"] == \
        next(r for r in v["rows"] if r["model"] == replay_eval.SERVED)["ne"]
    assert naive(v["window"]["train"]["to"]) < pd.Timestamp(WINDOW.test_from) <= naive(v["window"]["test"]["from"])
    text = (out / "report.md").read_text()
    for name in replay_eval.VARIANTS:
        assert f"| {name} |" in text
    assert "FM online on every served candidate" in text and "NE by tier" in text
    for png in ("coverage_over_time.png", "budget_ttl.png", "fm_inferences.png", "ne_by_tier.png", "variants.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    saved = json.loads((out / "result.json").read_text())
    assert saved["main"] == MAIN and saved["variants"]["rows"][0]["ne"] == v["rows"][0]["ne"]
    lk = result["lookup_ms"]
    assert lk["requests"] > 0 and 0 < lk["p50"] <= lk["p99"]
    assert sum(c["pairs_embedded"] for c in result["points"][MAIN]["cycles"]) > 0


def test_the_vintage_ablation_feeds_each_vintage_of_the_code_to_the_same_models(replayed):
    """One tier's test rows, scored by the oracle VM and the served VM fed the pair's code as of the
    request, the hour start, the serving run and as served: the two inputs each model was trained on
    reproduce its own test predictions; an item mean is almost never the pair's own code of its run."""
    _, result, out = replayed
    v = result["variants"]
    e = v["vintage_ablation"]
    exact = next(t for t in v["by_tier"] if t["tier"] == "item_mean")
    assert e["tier"] == "item_mean" and e["served_is_the_runs_code"] < 0.1
    assert e["rows"] == exact["pairs"] > 0 and 0 < e["context_guessed"] <= 1
    table = {t["model"]: t for t in e["table"]}
    assert len(table) == 3 + 2 * len(replay_eval.VINTAGES)
    # the oracle VM on the oracle's codes and the served VM on the served codes are their own test predictions
    assert table[f"{replay_eval.ORACLE}, fed the code as of the request (oracle)"]["ne"] == pytest.approx(exact["ne_oracle"], rel=1e-6)
    assert table[f"{replay_eval.SERVED}, fed the code as served"]["ne"] == pytest.approx(exact["ne_served"], rel=1e-6)
    assert table["VM"]["ne"] == pytest.approx(exact["ne_vm"], rel=1e-9) and table["VM"]["ne_vs_vm_pct"] == 0
    for t in e["table"][1:]:
        lo, hi = t["ne_vs_vm_pct_ci"]
        assert np.isfinite(t["ne"]) and lo <= hi
    assert "What a code carries on the item_mean rows, by its vintage" in (out / "report.md").read_text()


def test_every_consumer_gets_its_coverage_and_served_ne(replayed):
    """The conversion consumer of surface 1: its own rows' coverage, its variants on its label, no FM row."""
    cfg, result, out = replayed
    click, cvr = result["consumers"]["click"], result["consumers"]["cvr"]
    assert click["rows"] == result["variants"]["rows"]  # the click consumer of every surface is the main table
    assert [r["model"] for r in cvr["rows"]] == [v for v in replay_eval.VARIANTS if v not in ("VM + KD (soft labels)", "FM")]
    assert cvr["fm_beats_vm"] is None and all(np.isfinite(r["ne"]) for r in cvr["rows"])
    rows = served(point_cfg(cfg, MAIN))
    log = DeltaTable(str(cfg.lake.table_path("request_log"))).to_pandas()[["request_id", "item_id", "surface", "conversion"]]
    mine = rows.merge(log, on=["request_id", "item_id"])
    mine = mine[(mine["surface"].astype(str) == "1") & mine["conversion"].notna() & (mine["ts"] >= WINDOW.measure_from)]
    for t in TIERS:
        assert cvr["coverage"][t] == pytest.approx((mine["tier"] == t).mean())
    assert cvr["window"]["test"]["rows"] == int((mine["ts"] >= WINDOW.test_from).sum())
    text = (out / "report.md").read_text()
    assert "## Per consumer: coverage and NE as served" in text
    assert "| cvr | conversion | 1 |" in text and "n/a: the FM does not predict this task" in text


def test_the_session_feature_is_trained_into_every_variant_on_the_same_rows(replayed, tmp_path, capsys):
    """experiments.session_features on the finished replay: without the feature it reproduces the
    replay's own table (the variants are deterministic given the seed); with it every VM variant
    reads the last click (more weights), the FM is the same model; every model of both settings is
    compared with the plain VM on the same rows and seeds."""
    from experiments import session_features as sf

    cfg, result, out = replayed
    got = sf.compare(cfg, sf.finished_replay(cfg, out), EVAL, log=lambda *_: None)
    without = {r["model"]: r for r in got["without"]["rows"]}
    with_ = {r["model"]: r for r in got["with"]["rows"]}
    assert [(r["model"], r["ne"], r["auc"]) for r in got["without"]["rows"]] == \
        [(r["model"], r["ne"], r["auc"]) for r in result["variants"]["rows"]]
    assert list(with_) == list(without) and with_["FM"]["ne"] == without["FM"]["ne"]
    assert all(with_[m]["params"] > without[m]["params"] for m in without if m != "FM")
    against = {r["model"]: r for r in got["against_vm"]}
    assert list(against) == [*without, *(m + sf.SESSION for m in without if m != "FM")]
    assert against["VM"]["ne_vs_vm_pct"] == 0 and against["VM" + sf.SESSION]["ne"] == pytest.approx(with_["VM"]["ne"])
    for r in got["against_vm"][1:]:
        lo, hi = r["ne_vs_vm_pct_ci"]
        assert np.isfinite(r["ne"]) and lo <= hi
    text = sf.to_markdown(got)
    assert "## Every model against the plain VM without the feature" in text and "| VM + session |" in text
    assert json.loads(json.dumps(got, default=replay_report.jsonable))["against_vm"][0]["model"] == "VM"
    # a replay not run: a clear error, nothing written
    with pytest.raises(SystemExit) as e:
        sf.main(["--reports", str(tmp_path)])
    assert e.value.code == 2 and "run the replay first" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_consumers_learn_from_what_was_served(replayed, tmp_path):
    """The daily training of VM + SOLARIS on ``request_features`` (model.served_training), on the
    main point's served rows: the click consumer trains on exactly its rows of the window, reads the
    served embedding, and is compared with the plain VM on the same test rows; the conversion
    consumer of surface 1, with fewer rows than the minimum, is not trained and its plain VM keeps
    serving it."""
    import shutil

    from model import promotion, served_training, training
    from model.features import build_examples, row_inputs
    from model.train import infer
    from model.vm import VerticalModel, VMConfig

    cfg, result, _ = replayed
    pcfg = point_cfg(cfg, MAIN)
    lake, models = tmp_path / "lake", tmp_path / "models"
    shutil.copytree(cfg.lake.tables_path, lake / "tables")
    shutil.rmtree(lake / "tables" / "request_features", ignore_errors=True)  # the base lake's own, empty
    shutil.copytree(pcfg.lake.table_path("request_features"), lake / "tables" / "request_features")
    shutil.copytree(Path(result["initial_models"]["models"]["autoencoder"]).parents[1], models)
    rows = served(pcfg)
    rows = rows[rows["label"].notna()]
    hours = 2.0
    window = rows[rows["ts"] >= rows["ts"].max() + pd.Timedelta(microseconds=1) - pd.Timedelta(hours=hours)]
    log = DeltaTable(str(cfg.lake.table_path("request_log"))).to_pandas()[["request_id", "item_id", "surface", "conversion"]]
    cvr = window.merge(log, on=["request_id", "item_id"])
    n_cvr = int(((cvr["surface"].astype(str) == "1") & cvr["conversion"].notna()).sum())
    assert 0 < n_cvr < len(window) - 1 and len(window) < len(rows)
    tcfg = cfg.with_overrides(lake={"root": str(lake)},
                              models={"root": str(models), "served_min_rows": n_cvr + 1, "served_window_hours": hours})

    out = served_training.train_consumers(tcfg, TINY, "synthetic", log=lambda *_: None)
    click, conversion = out["decisions"]
    assert click["consumer"] == "click" and click["trained"] and click["rows"] == len(window)
    assert not conversion["trained"] and conversion["rows"] == n_cvr and not (models / "vm_cvr_solaris").exists()
    assert conversion["reason"].endswith("the plain VM vm_cvr keeps serving it")
    path = Path(out["models"]["vm_click_solaris"])
    assert path == models / "vm_click_solaris" / "v0001"
    trained_window = registry.read_json(path, "window.json")
    assert trained_window["trained_on"] == promotion.SERVED == served_training.TRAINED_ON
    assert sum(trained_window[k]["rows"] for k in ("train", "val", "test")) == len(window)
    m = registry.read_json(path, "metrics.json")
    assert m["ne_vs_vm_pct"] == pytest.approx(100 * (m["ne"] - m["ne_vm"]) / m["ne_vm"])
    assert m["ne_vs_vm_pct_ci"][0] <= m["ne_vs_vm_pct_ci"][1] and np.isfinite(m["ne_vs_vm_pct_ci"]).all()
    assert sum(m["train_tier_shares"].values()) == pytest.approx(1.0) and m["train_tier_shares"]["exact"] > 0

    # it reads what was served: the same rows with their embedding masked score otherwise
    vm = registry.load(path, VerticalModel, VMConfig)
    assert vm.cfg.use_fm_embedding and vm.cfg.fm_dim == TINY.code_dim
    vocab = Vocab.load(path / "vocab.json")
    events, items = mdata.events_and_items(tcfg, "synthetic")
    rows = mdata.served_rows(tcfg, window["ts"].min(), None, "synthetic")  # with their request_log context
    assert len(rows) == len(window)
    x = {**row_inputs(build_examples(rows, events, vocab, 1, items)), **training.vm_ids(vocab, rows),
         **served_training.served_inputs(rows, TINY.code_dim)}
    assert np.abs(infer(vm, vm, x) - infer(vm, vm, served_training.masked(x))).max() > 1e-6

    (decision,) = promotion.gate(models, out["models"])
    assert decision["promoted"] == (m["ne"] <= m["ne_vm"])


def test_bad_windows_and_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="measure_from <= test_from"):
        replay.ReplayWindow(datetime(2026, 1, 5, 6), datetime(2026, 1, 5, 10), datetime(2026, 1, 5, 9),
                            datetime(2026, 1, 5, 8))
    with pytest.raises(ValueError, match="whole hour"):
        replace(WINDOW, start=datetime(2026, 1, 5, 6, 30))
    env = {"SOLARIS_LAKE_ROOT": str(tmp_path / "lake"), "PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "experiments.replay", "--test-from", "2026-01-06T09:00:00"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "measure_from <= test_from" in p.stderr
    p = subprocess.run([sys.executable, "-m", "experiments.replay", "--data", "mind", "--input", str(tmp_path),
                        "--sample-fraction", "0.5"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "not to mind" in p.stderr
    p = subprocess.run([sys.executable, "-m", "experiments.replay", "--skip-ingest"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "ingest a log first" in p.stderr
