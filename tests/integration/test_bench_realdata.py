"""Benchmarks built from the shared real data (Tox21, QM8, scm20d, yeast) and MultiMNIST-3; each is
prepared, loaded and trained for a step or two. Tests skip with a clear message without the data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import realdata
from mtlflow import benchmarks, jobs
from mtlflow.core.errors import DataError

TINY = {"max_steps_per_epoch": 2, "progress": False}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_tox21_masks_missing_labels_and_reports_roc_auc(tmp_path: Path) -> None:
    realdata("chem", "tox21.csv")
    manifest = jobs.prepare("tox21", tmp_path / "data", n_molecules=400)
    # a few Tox21 SMILES fail RDKit's sanitisation and are skipped (and counted)
    assert manifest["molecules"] + manifest["invalid_smiles_skipped"] == 400 and manifest["molecules"] > 390
    assert 0.10 < manifest["missing_label_share"] < 0.25  # 17% in the full set
    bench, data = jobs.load_prepared(tmp_path / "data")
    targets = bench.unpack(next(iter(bench.make_loader(data.splits["train"], 64))))[1]
    assert len(targets) == 12 and any(bool(torch.isnan(t).any()) for t in targets)
    result = jobs.train(tmp_path / "data", tmp_path / "run", method="ls", epochs=1, batch_size=64, **TINY)
    losses = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"][0]["train_loss"]
    assert all(np.isfinite(v) for v in losses.values())  # NaN labels never reach the loss
    assert set(result["final"]["test"]["SR-p53"]) == {"loss", "roc_auc", "acc"}


def test_qm8_standardised_regression_with_mae_in_original_units(tmp_path: Path) -> None:
    realdata("chem", "qm8.csv.gz")
    jobs.prepare("qm8", tmp_path / "data", n_molecules=300)
    stats = json.loads((tmp_path / "data" / "targets.json").read_text())
    assert 0.02 < stats["train_std"]["E1-CC2"] < 0.08  # Hartree, as in the file (std 0.044 over all rows)
    result = jobs.train(tmp_path / "data", tmp_path / "run", method="ls", epochs=1, batch_size=64, **TINY)
    assert 0.0 < result["final"]["test"]["E1-CC2"]["mae"] < 0.2


def test_scm20d_targets_are_the_last_16_attributes(tmp_path: Path) -> None:
    realdata("mtr", "scm20d.arff")
    manifest = jobs.prepare("scm20d", tmp_path / "data")
    assert manifest["rows"] == 8966 and manifest["features"] == 61
    bench, data = jobs.load_prepared(tmp_path / "data")
    table = torch.load(tmp_path / "data" / "table.pt", weights_only=True)
    assert table["target_names"][0] == "LBL" and table["target_names"][-1] == "MTLp16A"
    x, targets = data.splits["train"][0]
    assert x.shape == (61,) and len(targets) == 16 and targets[0].shape == (2,)
    result = jobs.train(tmp_path / "data", tmp_path / "run", method="fairgrad", epochs=1, batch_size=256, **TINY)
    assert set(result["final"]["test"]["LBL"]) == {"loss", "mae", "rmse"}
    # bf16 autocast (the GPU option) also runs on the CPU: same recipe, finite losses, close to fp32
    bf16 = jobs.train(tmp_path / "data", tmp_path / "bf16", method="fairgrad", epochs=1, batch_size=256, amp="bf16",
                      **TINY)
    assert json.loads((tmp_path / "bf16" / "run.json").read_text())["config"]["amp"] == "bf16"
    assert bf16["final"]["test"]["LBL"]["mae"] == pytest.approx(result["final"]["test"]["LBL"]["mae"], rel=0.1)


def test_yeast_labels_come_from_the_mulan_xml(tmp_path: Path) -> None:
    realdata("mlc", "yeast.orig.arff.gz")
    jobs.prepare("yeast", tmp_path / "data")
    table = torch.load(tmp_path / "data" / "table.pt", weights_only=True)
    assert table["target_names"][:4] == ["Class1", "Class2", "Class3", "Class6"]  # the XML's order
    assert table["x"].shape == (2417, 103) and set(torch.unique(table["y"]).tolist()) == {0.0, 1.0}
    result = jobs.train(tmp_path / "data", tmp_path / "run", method="ls", epochs=1, batch_size=256, **TINY)
    assert set(result["final"]["test"]["Class1"]) == {"loss", "f1", "roc_auc", "acc"}


def test_realdata_files_are_checked_against_their_sha256sums(tmp_path: Path, monkeypatch) -> None:
    source = realdata("mlc", "yeast.orig.arff.gz")
    fake = tmp_path / "realdata"
    (fake / "mlc").mkdir(parents=True)
    for name in ("yeast.orig.arff.gz", "yeast.xml.gz"):
        (fake / "mlc" / name).write_bytes((source.parent / name).read_bytes())
    (fake / "SHA256SUMS").write_text(f"{'0' * 64}  ./mlc/yeast.orig.arff.gz\n")
    monkeypatch.setenv("MTLFLOW_REALDATA", str(fake))
    with pytest.raises(DataError, match="SHA256SUMS"):
        jobs.prepare("yeast", tmp_path / "data")


def test_multimnist3_places_three_digits_like_palora(tmp_path: Path) -> None:
    from mtlflow.benchmarks.multimnist3 import overlay_three

    blank, full = np.zeros((1, 28, 28), np.uint8), np.full((1, 28, 28), 255, np.uint8)
    top_left = overlay_three([full, blank, blank])[0]
    bottom_middle = overlay_three([blank, full, blank])[0]
    top_right = overlay_three([blank, blank, full])[0]
    # 42x42 canvas resized to 28x28: a 28x28 digit covers 2/3 of each side
    assert top_left[2, 2] == 255 and top_left[-2, -2] == 0 and top_left[2, -2] == 0
    assert bottom_middle[-2, 14] == 255 and bottom_middle[2, 14] == 0 and bottom_middle[-2, 1] == 0
    assert top_right[2, -2] == 255 and top_right[2, 2] == 0
    jobs.prepare("multimnist3", tmp_path / "data", n_train=256, n_val=64, n_test=64)
    bench, data = jobs.load_prepared(tmp_path / "data")
    image, labels = data.splits["train"][0]
    assert image.shape == (1, 28, 28) and len(labels) == 3
    blob = torch.load(tmp_path / "data" / "train.pt", weights_only=True)
    sources = blob["source_index"]
    assert bool((sources[:, 0] != sources[:, 1]).all() and (sources[:, 1] != sources[:, 2]).all())
    assert sum(p.numel() for p in bench.make_model().shared_parameters()) == 10 * 26 + 20 * 251 + 320 * 50 + 50
    result = jobs.train(tmp_path / "data", tmp_path / "run", method="ls", epochs=1, batch_size=64, **TINY)
    assert set(result["final"]["test"]) == {"top_left", "bottom_middle", "top_right"}


def test_realdata_benchmarks_refuse_to_run_without_the_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MTLFLOW_REALDATA", str(tmp_path / "nowhere"))
    monkeypatch.setattr("mtlflow.benchmarks.realdata.REPO_ROOT", tmp_path)
    monkeypatch.setattr("mtlflow.benchmarks.realdata.candidates", lambda: [tmp_path / "nowhere"])
    for name in ("tox21", "qm8", "scm20d", "yeast"):
        with pytest.raises(DataError, match="MTLFLOW_REALDATA"):
            benchmarks.build(name).prepare(tmp_path / name)
