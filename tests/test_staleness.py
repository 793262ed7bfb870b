"""The FM scored with its inputs read earlier than the request (experiments/staleness.py), on the shared tiny lake."""

import pandas as pd
import pytest

from tests.conftest import TINY


def test_as_of_times_are_the_request_its_hour_and_each_lag():
    from experiments.staleness import AS_OF_HOUR, AS_OF_REQUEST, as_of_times

    ts = pd.Series(pd.to_datetime(["2026-01-05 10:42:07", "2026-01-05 11:00:00"]))
    got = as_of_times(ts, [1, 2.5])
    assert list(got) == [AS_OF_REQUEST, AS_OF_HOUR, "1 h before the request", "2.5 h before the request"]
    assert got[AS_OF_HOUR].tolist() == [pd.Timestamp("2026-01-05 10:00"), pd.Timestamp("2026-01-05 11:00")]
    assert got["2.5 h before the request"].tolist() == [pd.Timestamp("2026-01-05 08:12:07"), pd.Timestamp("2026-01-05 08:30")]
    with pytest.raises(ValueError, match="lags are hours before the request"):
        as_of_times(ts, [0])


@pytest.mark.spark
def test_the_fm_is_scored_on_its_test_split_at_every_lag(base_lake):
    from experiments import staleness

    result = staleness.run(base_lake, "synthetic", TINY, [1, 6])
    rows = {r["as_of"]: r for r in result["rows"]}
    assert list(rows) == [staleness.AS_OF_REQUEST, staleness.AS_OF_HOUR, "1 h before the request", "6 h before the request"]
    first = rows[staleness.AS_OF_REQUEST]
    assert first["ne_vs_request_pct"] == 0.0 and first["ne_vs_request_pct_ci"] == (0.0, 0.0)
    for r in rows.values():
        assert r["ne_ci"][0] <= r["ne"] <= r["ne_ci"][1]
        assert r["ne_vs_request_pct_ci"][0] <= r["ne_vs_request_pct"] <= r["ne_vs_request_pct_ci"][1]
    # The FM's own test split: the one its training reported (the registry's window).
    from model import registry

    window = registry.read_json(registry.resolve_models(base_lake)["fm"], "window.json")["test"]
    assert (result["test"]["rows"], result["test"]["requests"]) == (window["rows"], window["requests"])
    assert first["ne"] == pytest.approx(registry.read_json(registry.resolve_models(base_lake)["fm"], "metrics.json")["ne"])
    assert "| as of the start of its hour |" in staleness.to_markdown(result)
