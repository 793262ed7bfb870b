"""User-sampled slices of a click log: the same users every time, with whole histories."""

import gzip

import pandas as pd
import pytest

from include import sample


def write_logs(tmp_path):
    rows = [(f"u{u}", f"i{(u * 7 + k) % 13}", 1_500_000_000_000 + 1000 * (u * 10 + k)) for u in range(200) for k in range(3)]
    df = pd.DataFrame(rows, columns=["user_id", "click_article_id", "click_timestamp"])
    paths = []
    for i, part in enumerate((df.iloc[:300], df.iloc[300:])):
        p = tmp_path / f"clicks_hour_{i:03d}.csv.gz"
        part.to_csv(p, index=False, compression="gzip")
        paths.append(str(p))
    return df, paths


def test_keeps_whole_histories_of_the_same_users(tmp_path):
    df, paths = write_logs(tmp_path)
    out = tmp_path / "slice" / "clicks.csv.gz"
    rows_in, rows_out = sample.sample(paths, out, 0.25, "user_id")
    got = pd.read_csv(out, dtype=str)
    assert rows_in == len(df) and rows_out == len(got) and list(got.columns) == list(df.columns)
    kept = set(got["user_id"])
    assert 20 < len(kept) < 80  # about a quarter of 200 users
    assert all(sample.keep_user(u, 0.25) for u in kept)
    assert (got.groupby("user_id").size() == 3).all()  # every row of a kept user
    # a smaller fraction keeps a subset of the same users; the same call gives the same file
    sample.sample(paths, tmp_path / "small.csv", 0.1, "user_id")
    assert set(pd.read_csv(tmp_path / "small.csv", dtype=str)["user_id"]) <= kept
    again = tmp_path / "again.csv.gz"
    sample.sample(list(reversed(paths)), again, 0.25, "user_id")
    assert gzip.open(again).read() == gzip.open(out).read()


def test_bad_arguments_are_clear_errors(tmp_path):
    _, paths = write_logs(tmp_path)
    with pytest.raises(ValueError, match="fraction"):
        sample.sample(paths, tmp_path / "x.csv", 0, "user_id")
    with pytest.raises(FileNotFoundError, match="no input files"):
        sample.sample([], tmp_path / "x.csv", 0.5, "user_id")
    with pytest.raises(ValueError, match="no column 'visitor'"):
        sample.sample(paths, tmp_path / "x.csv", 0.5, "visitor")
    assert not (tmp_path / "x.csv").exists()
