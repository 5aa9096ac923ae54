"""Image-folder specs: decoding, normalisation, train-only augmentation, missing images, the ResNet trunks
and their weights file, and each new key's bad input; images are scikit-learn's bundled 8x8 digits written
as PNG files (real data that a pinned dependency ships)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from mtlflow import benchmarks
from mtlflow.benchmarks._spec.schema import SpecError, read_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TASKS = [{"name": "digit", "type": "multiclass"}, {"name": "parity", "type": "binary"}]


def digit_folder(root: Path, n: int = 60) -> pd.DataFrame:
    """``n`` digits as 8-bit grey PNG files under root/img and their label table root/labels.csv."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        name = f"d{i:03d}.png"
        Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8)).save(root / "img" / name)
        rows.append({"file": name, "digit": int(digits.target[i]), "parity": int(digits.target[i] % 2)})
    labels = pd.DataFrame(rows)
    labels.to_csv(root / "labels.csv", index=False)
    return labels


def image_spec(root: Path, **changes) -> Path:
    spec = {"name": "digits", "source": {"table": "labels.csv", "images": "img", "image_column": "file"},
            "tasks": TASKS, "features": {"image": {"size": 8}}, "model": {"trunk": "resnet18"}}
    for key, value in changes.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def pixels(root: Path, name: str) -> np.ndarray:
    return np.asarray(Image.open(root / "img" / name), dtype=np.float64)


def test_images_are_decoded_at_their_size_normalised_and_augmented_only_in_training(tmp_path: Path) -> None:
    labels = digit_folder(tmp_path)
    mean, std = [0.1, 0.2, 0.3], [0.5, 0.25, 2.0]
    bench = benchmarks.build("spec", spec=str(image_spec(
        tmp_path, features={"image": {"size": 8, "mean": mean, "std": std,
                                      "augment": [{"name": "RandomHorizontalFlip", "options": {"p": 1.0}}]}})))
    manifest = bench.prepare(tmp_path / "data")
    assert manifest["missing_images_skipped"] == 0 and "images.npy" in manifest["files"]
    loaded = bench.load(tmp_path / "data")
    split = np.load(tmp_path / "data" / "split.npy")
    stored = np.load(tmp_path / "data" / "images.npy")
    assert stored.shape == (60, 3, 8, 8) and stored.dtype == np.uint8
    for row in (0, 17, 59):  # a grey 8x8 PNG at size 8: each channel is the file's pixels
        for channel in range(3):
            np.testing.assert_array_equal(stored[row, channel], pixels(tmp_path, labels["file"][row]))
    scale = np.array(std)[:, None, None]
    shift = np.array(mean)[:, None, None]
    for name, code, flipped in (("val", 1, False), ("train", 0, True)):
        rows = np.flatnonzero(split == code)
        dataset = loaded.splits[name]
        batch, targets = dataset.__getitems__([2, 0])
        for position, index in enumerate((2, 0)):
            grey = pixels(tmp_path, labels["file"][rows[index]])
            grey = grey[:, ::-1] if flipped else grey
            np.testing.assert_allclose(batch[position].numpy(), (grey / 255.0 - shift) / scale, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(targets[0].numpy(), labels["digit"].to_numpy()[rows[[2, 0]]])


def test_missing_images_below_the_threshold_are_skipped_and_counted(tmp_path: Path) -> None:
    labels = digit_folder(tmp_path)
    for name in labels["file"][[3, 40]]:
        (tmp_path / "img" / name).unlink()
    (tmp_path / "img" / labels["file"][7]).write_bytes(b"not a png")  # unreadable counts as missing
    bench = benchmarks.build("spec", spec=str(image_spec(tmp_path, source={"max_missing_share": 0.05})))
    manifest = bench.prepare(tmp_path / "data")
    assert manifest["missing_images_skipped"] == 3
    assert sum(manifest["split_sizes"].values()) == 57 and manifest["source"]["rows"] == 60
    kept = labels.drop(index=[3, 7, 40]).reset_index(drop=True)
    stored = np.load(tmp_path / "data" / "images.npy")
    assert stored.shape[0] == 57
    np.testing.assert_array_equal(stored[3, 0], pixels(tmp_path, kept["file"][3]))  # row 4 of the table
    np.testing.assert_array_equal(stored[-1, 0], pixels(tmp_path, kept["file"][56]))
    assert sum(sum(c.values()) for c in manifest["label_counts"].values()) == 2 * 57
    with np.load(tmp_path / "data" / "labels.npz") as stored_labels:  # each kept image keeps its own labels
        np.testing.assert_array_equal(stored_labels["task0"], kept["digit"])  # class index = digit (0..9)
        np.testing.assert_array_equal(stored_labels["task1"], kept["parity"])


def test_missing_images_above_the_threshold_fail_and_write_nothing(tmp_path: Path) -> None:
    labels = digit_folder(tmp_path)
    for name in labels["file"][:4]:
        (tmp_path / "img" / name).unlink()
    bench = benchmarks.build("spec", spec=str(image_spec(tmp_path, source={"max_missing_share": 0.05})))
    with pytest.raises(SpecError) as caught:
        bench.prepare(tmp_path / "data")
    assert str(caught.value).startswith(f"{tmp_path / 'spec.yaml'}:4: source.images: 4 of 60 images are missing or "
                                        "unreadable (first: d000.png; above max_missing_share 0.05)")
    assert not (tmp_path / "data").exists()


def test_a_changed_image_is_new_data(tmp_path: Path) -> None:
    labels = digit_folder(tmp_path, 20)
    bench = benchmarks.build("spec", spec=str(image_spec(tmp_path)))
    before = bench.data_identity()
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(tmp_path / "img" / labels["file"][5])
    after = bench.data_identity()
    assert before["table_sha256"] == after["table_sha256"] and before["images_sha256"] != after["images_sha256"]


def test_resnet_trunks_start_from_the_weights_file_and_have_one_head_per_task(tmp_path: Path) -> None:
    from torchvision.models import resnet18

    digit_folder(tmp_path, 40)
    torch.manual_seed(3)
    source = resnet18(num_classes=7)  # its fc does not fit the trunk and is not used
    torch.save(source.state_dict(), tmp_path / "r18.pt")
    bench = benchmarks.build("spec", spec=str(image_spec(tmp_path, model={"weights": "r18.pt"})))
    bench.prepare(tmp_path / "data")
    loaded = bench.load(tmp_path / "data")
    model = bench.make_model()
    trunk = model.trunk.backbone.state_dict()
    for key, value in source.state_dict().items():
        if not key.startswith("fc."):
            assert torch.equal(trunk[key], value), key
    batch, _ = loaded.splits["val"].__getitems__([0, 1, 2])
    assert [o.shape for o in model(batch)] == [(3, 10), (3, 1)]  # ten digit classes; one binary logit
    random_init = benchmarks.build("spec", **bench.config).make_model()  # no weights key: torchvision's init
    assert random_init.state_dict().keys() == model.state_dict().keys()


@pytest.mark.parametrize("trunk, weights, expected", [
    ("resnet18", "nothere.pt", "model.weights: ResNet-18 weights not found: "),
    ("resnet50", "r18.pt", "model.weights: ResNet-50 weights {w} do not fit torchvision resnet50 ("),
    ("resnet18", "junk.pt", "model.weights: ResNet-18 weights {w} cannot be read as a state_dict ("),
])
def test_a_missing_or_mismatched_weights_file_is_one_line_at_prepare(tmp_path: Path, trunk: str, weights: str,
                                                                     expected: str) -> None:
    """The weights file is checked when the data is prepared, not only when `train` builds the model."""
    from torchvision.models import resnet18

    digit_folder(tmp_path, 30)
    torch.save(resnet18().state_dict(), tmp_path / "r18.pt")
    (tmp_path / "junk.pt").write_bytes(b"not torch")
    bench = benchmarks.build("spec", spec=str(image_spec(tmp_path, model={"trunk": trunk, "weights": weights})))
    with pytest.raises(SpecError) as caught:
        bench.prepare(tmp_path / "data")
    assert not (tmp_path / "data").exists()
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "spec.yaml")) and "\n" not in message
    assert expected.format(w=tmp_path / weights) in message and "give a torchvision" in message, message


@pytest.mark.parametrize("changes, expected", [
    ({"model": {"trunk": "resnet34"}}, "model.trunk: 'resnet34' is not valid: input should be 'mlp', 'mpnn', "
                                       "'resnet18' or 'resnet50'"),
    ({"model": {"trunk": "mlp"}}, "images train a resnet18 or resnet50 trunk, not mlp"),
    ({"model": {"trunk": "mlp", "weights": "w.pt"}}, "model: weights are for the resnet18 / resnet50 trunks"),
    ({"features": {"image": {"size": 4}}}, "features.image.size: Input should be greater than or equal to 8"),
    ({"features": {"image": {"std": [1, 0, 1]}}}, "features.image.std[1]: Input should be greater than 0"),
    ({"features": {"image": {"augment": [{"name": "RandomFlop"}]}}},
     "features.image.augment[0]: 'RandomFlop' is not a torchvision.transforms.v2 transform"),
    ({"features": {"image": {"augment": [{"name": "RandomRotation", "options": {"degree": 5}}]}}},
     "features.image.augment[0]: RandomRotation(degree=5) fails: "),
    ({"features": {"numeric": ["digit"]}}, "an image table's input is its images; drop features.numeric"),
])
def test_image_spec_errors_name_the_key_path(tmp_path: Path, changes: dict, expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        read_spec(image_spec(tmp_path, **changes))
    assert expected in str(caught.value) and str(caught.value).startswith(str(tmp_path / "spec.yaml") + ":")


@pytest.mark.parametrize("case, expected", [
    ("no_folder", "source.images: image folder not found: "),
    ("no_column", "source.image_column: column 'file' is not in the table (columns: name, digit, parity)"),
])
def test_image_source_errors_write_nothing(tmp_path: Path, case: str, expected: str) -> None:
    labels = digit_folder(tmp_path, 20)
    if case == "no_folder":
        (tmp_path / "img").rename(tmp_path / "elsewhere")
    else:
        labels.rename(columns={"file": "name"}).to_csv(tmp_path / "labels.csv", index=False)
    with pytest.raises(SpecError) as caught:
        benchmarks.build("spec", spec=str(image_spec(tmp_path))).prepare(tmp_path / "data")
    assert expected in str(caught.value), str(caught.value)
    assert not (tmp_path / "data").exists()


def test_a_training_whose_model_cannot_be_built_leaves_no_run_directory(tmp_path: Path, capsys) -> None:
    """The weights file is checked again when the model is built, after the run directory was locked (here it
    went away after prepare): the failed command must still leave nothing behind (no directory, no lock file)."""
    from torchvision.models import resnet18

    from mtlflow.cli import main

    digit_folder(tmp_path, 30)
    torch.save(resnet18().state_dict(), tmp_path / "nothere.pt")
    spec = image_spec(tmp_path, model={"trunk": "resnet18", "weights": "nothere.pt"})
    assert main(["prepare", "--spec", str(spec), "--out", str(tmp_path / "data")]) == 0
    (tmp_path / "nothere.pt").unlink()
    out = tmp_path / "runs" / "ls"
    code = main(["train", "--data", str(tmp_path / "data"), "--method", "ls", "--epochs", "1", "--out", str(out),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "model.weights: ResNet-18 weights not found" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
