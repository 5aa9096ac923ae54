"""Benchmarks whose data is mounted on the cluster (CelebA, NYUv2, CityScapes, Office-31, Office-Home):
loaders, models and metrics on tiny fixtures written in exactly the datasets' on-disk layouts."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mtlflow import benchmarks, jobs
from mtlflow.core.errors import DataError

RNG = np.random.default_rng(0)


def write_jpeg(path: Path, size: tuple[int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(RNG.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path, quality=80)


# -- CelebA -----------------------------------------------------------------------------------------

def write_celeba(root: Path, n: int = 12) -> np.ndarray:
    """Official layout: Anno/list_attr_celeba.txt (count line, names, ±1 rows), Eval/, Img/img_align_celeba/."""
    from mtlflow.benchmarks.celeba import ATTRIBUTES

    labels = RNG.integers(0, 2, (n, 40))
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    rows = [f"{name} " + " ".join("1" if v else "-1" for v in row) for name, row in zip(names, labels, strict=True)]
    (root / "Anno").mkdir(parents=True)
    (root / "Anno" / "list_attr_celeba.txt").write_text(f"{n}\n" + " ".join(ATTRIBUTES) + "\n" + "\n".join(rows) + "\n")
    (root / "Eval").mkdir()
    parts = [0] * (n - 4) + [1, 1, 2, 2]
    (root / "Eval" / "list_eval_partition.txt").write_text(
        "".join(f"{m} {p}\n" for m, p in zip(names, parts, strict=True)))
    for name in names:
        write_jpeg(root / "Img" / "img_align_celeba" / name, (178, 218))
    return labels


def test_celeba_fixture_loads_trains_and_reports_f1(tmp_path: Path) -> None:
    labels = write_celeba(tmp_path / "celeba")
    data = tmp_path / "prepared"
    jobs.prepare("celeba", data, data_dir=str(tmp_path / "celeba"), image_size=32)
    bench, loaded = jobs.load_prepared(data)
    assert {s: len(d) for s, d in loaded.splits.items()} == {"train": 8, "val": 2, "test": 2}
    image, targets = loaded.splits["test"][0]
    assert image.shape == (3, 32, 32) and 0.0 <= float(image.min()) <= float(image.max()) <= 1.0
    assert [int(t) for t in targets] == labels[10].tolist()  # 000011.jpg is the first test image
    model = bench.make_model()
    assert len(model(image.unsqueeze(0).repeat(2, 1, 1, 1))) == 40
    result = jobs.train(data, tmp_path / "run", method="ls", epochs=1, batch_size=4, max_steps_per_epoch=1,
                        progress=False)
    assert set(result["final"]["test"]["Smiling"]) == {"loss", "f1", "acc"}
    refs = bench.published_references()
    assert len(refs.metrics) == 40 and refs.metrics["Male"]["f1"] == pytest.approx(0.9703)


def test_celeba_rejects_missing_or_mismatched_annotations(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--data-dir"):
        jobs.prepare("celeba", tmp_path / "out")
    write_celeba(tmp_path / "celeba", n=6)
    (tmp_path / "celeba" / "Img" / "img_align_celeba" / "000003.jpg").unlink()
    with pytest.raises(DataError, match="missing"):
        jobs.prepare("celeba", tmp_path / "out", data_dir=str(tmp_path / "celeba"))


# -- NYUv2 / CityScapes --------------------------------------------------------------------------------

def _save_npy(split_dir: Path, name: str, sub: str, arr: np.ndarray) -> None:
    (split_dir / sub).mkdir(parents=True, exist_ok=True)
    np.save(split_dir / sub / name, arr)


def write_mtan(root: Path, label_dir: str, classes: int, normals: bool, n_train: int = 3, n_val: int = 2,
               shape: tuple[int, int] = (32, 64)) -> None:
    """MTAN layout: {train,val}/{image,<label_dir>,depth[,normal]}/<i>.npy, HWC images, HW labels (-1 ignore)."""
    h, w = shape
    for folder, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            save = functools.partial(_save_npy, root / folder, f"{i}.npy")
            save("image", RNG.random((h, w, 3), dtype=np.float32))
            label = RNG.integers(-1, classes, (h, w)).astype(np.float32)
            save(label_dir, label)
            depth = RNG.uniform(0.5, 5.0, (h, w, 1)).astype(np.float32)
            depth[0, :4] = 0.0  # missing depth
            save("depth", depth)
            if normals:
                n = RNG.normal(size=(h, w, 3)).astype(np.float32)
                n /= np.linalg.norm(n, axis=-1, keepdims=True)
                n[1, :4] = 0.0  # missing normals
                save("normal", n)


def test_nyuv2_fixture_mtan_trains_and_reports_every_metric(tmp_path: Path) -> None:
    write_mtan(tmp_path / "nyu", "label", 13, normals=True)
    data = tmp_path / "prepared"
    jobs.prepare("nyuv2", data, data_dir=str(tmp_path / "nyu"), width_divisor=8)
    bench, loaded = jobs.load_prepared(data)
    assert [len(loaded.splits[s]) for s in ("train", "val", "test")] == [3, 2, 2]
    image, (seg, depth, normal) = loaded.splits["train"][0]  # augmented
    assert image.shape == (3, 32, 64) and seg.shape == (32, 64) and seg.dtype == torch.int64
    assert depth.shape == (1, 32, 64) and normal.shape == (3, 32, 64)
    assert set(seg.unique().tolist()) <= set(range(-1, 13))
    model = bench.make_model()
    seg_out, depth_out, normal_out = model(image.unsqueeze(0))
    assert seg_out.shape == (1, 13, 32, 64) and depth_out.shape == (1, 1, 32, 64)
    assert torch.allclose(normal_out.norm(dim=1), torch.ones(1, 32, 64), atol=1e-5)
    result = jobs.train(data, tmp_path / "run", method="ls", epochs=1, batch_size=2, max_steps_per_epoch=1,
                        select="last", progress=False)
    test = result["final"]["test"]
    assert set(test["segmentation"]) == {"loss", "miou", "pix_acc"}
    assert set(test["depth"]) == {"loss", "abs_err", "rel_err"}
    assert set(test["normal"]) == {"loss", "angle_mean", "angle_median", "within_11.25", "within_22.5", "within_30"}
    assert set(bench.published_references().metrics["normal"]) == set(test["normal"]) - {"loss"}


def test_cityscapes_fixture_segnet_and_held_out_validation(tmp_path: Path) -> None:
    write_mtan(tmp_path / "city", "label_7", 7, normals=False, n_train=4)
    data = tmp_path / "prepared"
    jobs.prepare("cityscapes", data, data_dir=str(tmp_path / "city"), model="segnet", n_val_from_train=1,
                 width_divisor=8)
    bench, loaded = jobs.load_prepared(data)
    assert [len(loaded.splits[s]) for s in ("train", "val", "test")] == [3, 1, 2]
    assert bench.task_names == ["segmentation", "depth"]
    result = jobs.train(data, tmp_path / "run", method="ls", epochs=1, batch_size=2, max_steps_per_epoch=1,
                        select="last", progress=False, tasks=["depth"])
    assert set(result["final"]["test"]) == {"depth"}


def test_joint_augmentation_flips_normals_and_rescales_depth(monkeypatch) -> None:
    from mtlflow.benchmarks import _scene

    image = torch.arange(2 * 6, dtype=torch.float32).reshape(1, 2, 6).repeat(3, 1, 1)
    seg = torch.arange(12, dtype=torch.float32).reshape(1, 2, 6)
    depth = torch.full((1, 2, 6), 3.0)
    normal = torch.stack([torch.full((2, 6), 0.6), torch.zeros(2, 6), torch.full((2, 6), 0.8)])
    # scale 1 (index 0), crop at (0, 0), flip: the result is the mirrored input with the normals' x negated
    monkeypatch.setattr(_scene.torch, "randint", lambda high, size: torch.tensor(0))
    monkeypatch.setattr(_scene.torch, "rand", lambda size: torch.tensor(0.0))
    out_image, out = _scene.random_scale_crop_flip(image, {"segmentation": seg, "depth": depth, "normal": normal})
    assert torch.equal(out_image, image.flip(-1))
    assert torch.equal(out["segmentation"], seg.flip(-1))
    assert torch.allclose(out["normal"][0], torch.full((2, 6), -0.6)) and torch.equal(out["normal"][2], normal[2])
    # scale 1.5 (index 2), no flip: zoomed in, labels stay labels (nearest), depth divided by the scale
    monkeypatch.setattr(_scene.torch, "randint", lambda high, size: torch.tensor(min(2, int(high) - 1)))
    monkeypatch.setattr(_scene.torch, "rand", lambda size: torch.tensor(0.9))
    out_image, out = _scene.random_scale_crop_flip(image, {"segmentation": seg, "depth": depth, "normal": normal})
    assert out_image.shape == image.shape
    assert set(out["segmentation"].unique().tolist()) <= set(seg.unique().tolist())
    assert torch.allclose(out["depth"], torch.full((1, 2, 6), 2.0))
    assert torch.allclose(out["normal"][0], torch.full((2, 6), 0.6))


# -- Office-31 / Office-Home (multi-input) ------------------------------------------------------------

def write_office(root: Path, domains: dict[str, str], n_classes: int, per_class: int = 5) -> None:
    for folder in domains.values():
        for c in range(n_classes):
            for i in range(per_class):
                write_jpeg(root / folder / f"class_{c:02d}" / f"frame_{i:04d}.jpg", (12, 10))


def test_office31_multi_input_trains_and_evaluates_every_image_once(tmp_path: Path) -> None:
    write_office(tmp_path / "office31", {"amazon": "amazon/images", "dslr": "dslr/images",
                                         "webcam": "webcam/images"}, 31, per_class=10)
    # dslr and webcam are smaller: their rows cycle in training and are padded in evaluation
    for domain in ("dslr", "webcam"):
        for c in range(31):
            for i in range(5, 10):
                (tmp_path / "office31" / domain / "images" / f"class_{c:02d}" / f"frame_{i:04d}.jpg").unlink()
    data = tmp_path / "prepared"
    jobs.prepare("office31", data, data_dir=str(tmp_path / "office31"), image_size=32)
    bench, loaded = jobs.load_prepared(data)
    lines = (data / "splits" / "amazon_train.txt").read_text().splitlines()
    assert len(lines) == 31 * 6 and lines[0].startswith("amazon/images/class_")
    test = loaded.splits["test"]
    assert len(test) == 62  # amazon: 10 -> 6/2/2 per class; dslr/webcam: 5 -> 3/1/1, padded to 62 rows
    images, labels = test[61]
    assert int(labels[0]) >= 0 and int(labels[1]) == int(labels[2]) == -1
    assert float(images[1].abs().sum()) == 0.0
    assert images.shape == (3, 3, 32, 32)
    model = bench.make_model()
    assert [o.shape for o in model(images.unsqueeze(0).repeat(2, 1, 1, 1, 1))] == [(2, 31)] * 3
    result = jobs.train(data, tmp_path / "run", method="ls", epochs=1, batch_size=8, max_steps_per_epoch=1,
                        progress=False)
    assert set(result["final"]["test"]) == {"amazon", "dslr", "webcam"}

    from mtlflow.metrics.classification import MaskedAccuracy

    metric = MaskedAccuracy()
    for i in range(len(test)):
        metric.update(torch.zeros(1, 31), test[i][1][1].reshape(1))
    assert metric.total == sum(1 for line in (data / "splits" / "dslr_test.txt").read_text().splitlines())
    # a single-task reference reads only its own domain's images
    single = bench.make_model(["webcam"])
    assert single.input_index == [2] and len(single(images.unsqueeze(0).repeat(2, 1, 1, 1, 1))) == 1


def test_officehome_accepts_real_world_with_a_space_and_given_split_lists(tmp_path: Path) -> None:
    domains = {"art": "Art", "clipart": "Clipart", "product": "Product", "real_world": "Real World"}
    write_office(tmp_path / "oh", domains, 65, per_class=1)
    lists = tmp_path / "data_txt"
    lists.mkdir()
    for stem, folder in (("Art", "Art"), ("Clipart", "Clipart"), ("Product", "Product"), ("Real_World", "Real World")):
        for split in ("train", "val", "test"):
            (lists / f"{stem}_{split}.txt").write_text(f"{folder}/class_07/frame_0000.jpg 7\n")
    data = tmp_path / "prepared"
    jobs.prepare("officehome", data, data_dir=str(tmp_path / "oh"), split_dir=str(lists), image_size=16)
    bench, loaded = jobs.load_prepared(data)
    assert bench.task_names == ["art", "clipart", "product", "real_world"]
    images, labels = loaded.splits["val"][0]
    assert images.shape == (4, 3, 16, 16) and [int(v) for v in labels] == [7, 7, 7, 7]
    (lists / "Art_val.txt").write_text("Art/class_07/missing.jpg 7\n")
    with pytest.raises(DataError, match="missing"):
        jobs.prepare("officehome", tmp_path / "bad", data_dir=str(tmp_path / "oh"), split_dir=str(lists))


def test_every_benchmark_is_registered_with_a_recipe_and_a_cpu_smoke_config() -> None:
    names = benchmarks.available()
    for expected in ("qm9", "celeba", "nyuv2", "cityscapes", "office31", "officehome", "multimnist3", "tox21",
                     "qm8", "scm20d", "yeast", "multimnist", "toy"):
        assert expected in names
    for name in ("qm9", "celeba", "nyuv2", "cityscapes", "office31", "officehome", "multimnist3", "tox21", "qm8",
                 "scm20d", "yeast"):
        cls = benchmarks.get(name)
        assert cls.train_defaults["epochs"] >= 1 and cls.cpu_smoke["train_options"]["epochs"] >= 1
        cls(**cls.cpu_smoke["data_options"])  # the smoke options are valid
