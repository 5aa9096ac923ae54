"""An image-folder spec end to end through the CLI, on real images that a pinned dependency ships:
scikit-learn's 8x8 digits, written as PNG files into a temporary folder with a label table (digit:
multiclass, parity and large (>= 5): binary). Prepare with a few images missing (below the threshold:
skipped and counted), train two methods with the ResNet-18 trunk, resume one; above the threshold the
prepare fails in one line and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from mtlflow.cli import main

# the CLI runs in this process (its parser, its error handling and exit codes, without a new interpreter's
# imports), with one intra-op thread: tiny images gain nothing from more
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

TINY = ["--batch-size", "16", "--max-steps-per-epoch", "1", "--eval-batch-size", "200", "--no-progress"]


def digits_folder(root: Path, n: int, missing: int) -> Path:
    """``n`` digits as PNG files and their label table; the first ``missing`` files are not written."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        name, digit = f"{i:04d}.png", int(digits.target[i])
        if i >= missing:
            Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8)).save(root / "img" / name)
        rows.append({"path": name, "digit": digit, "parity": digit % 2, "large": int(digit >= 5)})
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)
    spec = {"name": "digits",
            "source": {"table": "labels.csv", "images": "img", "image_column": "path"},
            "tasks": [{"name": "digit", "type": "multiclass"}, {"name": "parity", "type": "binary"},
                      {"name": "large", "type": "binary"}],
            "features": {"image": {"size": 8, "mean": [0.5] * 3, "std": [0.5] * 3,
                                   "augment": [{"name": "RandomAffine", "options": {"degrees": 10}}]}},
            "model": {"trunk": "resnet18"}}
    (root / "digits.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root / "digits.yaml"


def test_an_image_folder_spec_prepares_trains_two_methods_and_resumes(tmp_path: Path, capsys) -> None:
    spec = digits_folder(tmp_path, 200, missing=2)  # 2 of 200 = max_missing_share's default 0.01
    assert main(["prepare", "--spec", str(spec), "--out", str(tmp_path / "data")]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["missing_images_skipped"] == 2 and sum(manifest["split_sizes"].values()) == 198
    assert manifest["label_counts"]["digit"] == manifest["split_sizes"]
    for method in ("ls", "mgda"):
        code = main(["train", "--data", str(tmp_path / "data"), "--method", method, "--epochs", "1",
                     "--out", str(tmp_path / method), *TINY])
        assert code == 0, capsys.readouterr().err
        final = json.loads((tmp_path / method / "metrics.json").read_text())["final"]["test"]
        assert set(final) == {"digit", "parity", "large"}
        assert set(final["digit"]) == {"loss", "acc", "macro_f1"} and 0 <= final["parity"]["roc_auc"] <= 1
        assert all(np.isfinite(m["loss"]) for m in final.values())
    code = main(["train", "--data", str(tmp_path / "data"), "--method", "mgda", "--epochs", "2", "--resume",
                 "--out", str(tmp_path / "mgda"), *TINY])
    assert code == 0, capsys.readouterr().err
    history = json.loads((tmp_path / "mgda" / "metrics.json").read_text())["epochs"]
    assert [row["epoch"] for row in history] == [1, 2]


def test_missing_images_above_the_threshold_fail_in_one_line_and_write_nothing(tmp_path: Path, capsys,
                                                                                 monkeypatch) -> None:
    monkeypatch.setenv("MTLFLOW_CACHE", str(tmp_path / "cache"))
    spec = digits_folder(tmp_path, 100, missing=3)  # 3 of 100 > 0.01
    capsys.readouterr()
    assert main(["prepare", "--spec", str(spec), "--out", str(tmp_path / "data")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [f"mtlflow: error: {spec}:4: source.images: 3 of 100 images are missing or unreadable (first: "
                     "0000.png; above max_missing_share 0.01); fix the folder or the 'path' column, or raise "
                     "source.max_missing_share"]
    assert not (tmp_path / "data").exists() and not (tmp_path / "cache").exists()


def test_spec_init_finds_the_image_column_and_folder_and_its_spec_trains(tmp_path: Path, capsys) -> None:
    digits_folder(tmp_path, 120, missing=1)
    out = tmp_path / "init.yaml"
    assert main(["spec", "init", str(tmp_path / "labels.csv"), "--tasks", "digit,parity,large",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    text = out.read_text()
    spec = yaml.safe_load(text)
    # the image file names are in column "path" and the files in the subfolder img/, found without --images
    assert spec["source"] == {"table": "labels.csv", "images": "img", "image_column": "path"}
    assert "features" not in spec and [t["type"] for t in spec["tasks"]] == ["multiclass", "binary", "binary"]
    assert "# images: column path names image files; 119 of the first 120 are in img" in text
    assert main(["prepare", "--spec", str(out), "--out", str(tmp_path / "data")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "data" / "manifest.json").read_text())["missing_images_skipped"] == 1
    assert main(["train", "--data", str(tmp_path / "data"), "--method", "ls", "--epochs", "1",
                 "--out", str(tmp_path / "ls"), *TINY]) == 0, capsys.readouterr().err


def test_spec_init_with_an_image_folder_that_holds_none_of_the_images_fails_in_one_line(tmp_path: Path,
                                                                                        capsys) -> None:
    digits_folder(tmp_path, 20, missing=0)
    (tmp_path / "empty").mkdir()
    out = tmp_path / "init.yaml"
    capsys.readouterr()
    assert main(["spec", "init", str(tmp_path / "labels.csv"), "--tasks", "digit", "--images",
                 str(tmp_path / "empty"), "--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [f"mtlflow: error: column path names image files (e.g. 0000.png), but none of the first 20 is "
                     f"in {tmp_path / 'empty'}; give their folder with --images DIR"]
    assert not out.exists()
