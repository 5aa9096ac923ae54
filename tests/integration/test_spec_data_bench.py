"""`mtlflow bench --spec-data` on a small table: the prepared data is the spec's, both loops train, and the
table reports what was measured (the numbers themselves are measured by the bench, not asserted)."""

from __future__ import annotations

import json

import numpy as np

from conftest import run_cli


def test_spec_data_bench_writes_its_table(tmp_path) -> None:
    proc = run_cli("bench", "--spec-data", "--rows", "3000", "--columns", "12", "--steps", "50", "--warmup", "2",
                   "--batch-size", "32", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "spec_data.json").read_text())
    prepare, train = summary["prepare"], summary["train"]
    assert prepare["rows"] == 3000 and prepare["csv_bytes"] > 3000 * 12
    assert 0 < prepare["prepare_seconds"] < prepare["process_seconds"]
    assert prepare["peak_rss_bytes"] >= prepare["baseline_rss_bytes"] > 0
    # 50 timed steps in alternating chunks of 25: two chunks of each loop, and the rates are their samples/time
    ours = np.array(train["mtlflow_chunk_rates"])
    samples = 25 * 32
    assert len(ours) == 2 and (ours > 0).all()
    assert np.isclose(train["mtlflow_samples_per_second"], 50 * 32 / (samples / ours).sum())
    assert set(train["hand_written"]) == {"index", "index_select"}
    for hand in train["hand_written"].values():
        theirs = np.array(hand["chunk_rates"])
        assert len(theirs) == 2 and (theirs > 0).all()
        assert np.isclose(hand["samples_per_second"], 50 * 32 / (samples / theirs).sum())
        assert hand["ratio"] == train["mtlflow_samples_per_second"] / hand["samples_per_second"]
        assert np.isclose(hand["chunk_ratio_median"], np.median(ours / theirs))
    assert "3,000 rows x 12 columns" in (tmp_path / "spec_data.md").read_text()


def test_the_synthetic_table_has_its_labels_and_missing_share(tmp_path) -> None:
    import pandas as pd

    from mtlflow.experiments.spec_data_bench import write_table

    write_table(tmp_path / "t.csv", 4000, 10, seed=1)
    frame = pd.read_csv(tmp_path / "t.csv")
    assert frame.shape == (4000, 10)
    assert set(frame["churned"].dropna().unique()) == {0.0, 1.0} and set(frame["region"].unique()) <= {
        f"c{i}" for i in range(12)}
    assert 0.03 < frame["spend"].isna().mean() < 0.07
    # the labels depend on the features: the regression label correlates with their sum
    signal = frame[[f"x{i}" for i in range(6)]].sum(axis=1)
    assert np.corrcoef(signal[frame["spend"].notna()], frame["spend"].dropna())[0, 1] > 0.8
