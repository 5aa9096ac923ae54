"""`mtlflow bench` times the network the CelebA benchmark trains, not a look-alike."""

from __future__ import annotations

import torch

from mtlflow.benchmarks.celeba import CelebA
from mtlflow.experiments.bench import SyntheticCelebA
from mtlflow.models.celeba_cnn import CelebACNN


def test_bench_times_the_celeba_benchmarks_network():
    timed = SyntheticCelebA(n_tasks=40).make_model()
    trained = CelebA().make_model()
    assert isinstance(timed.trunk, CelebACNN)
    assert str(timed) == str(trained)  # same layers, widths, pooling, biases and BatchNorm, same 40 heads
    shapes = lambda model: [tuple(p.shape) for p in model.parameters()]  # noqa: E731
    assert shapes(timed) == shapes(trained)
    # by hand: convs 9·(3·64 + 64·128 + 128·128 + 128·256 + 256·256 + 256·512 + 512·512) = 4,646,592, their
    # BatchNorms 2·1,856 = 3,712, FC 2·512·512 = 524,288 and their BatchNorms 2·2·512 = 2,048
    assert sum(p.numel() for p in trained.trunk.parameters()) == 5_176_640


def test_a_narrower_bench_network_scales_every_layer():
    narrow = CelebACNN(width=2)
    convs = [m.out_channels for m in narrow.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs == [2, 4, 4, 8, 8, 16, 16]
    assert narrow(torch.randn(2, 3, 16, 16)).shape == (2, 16)
    assert all(m.bias is None for m in narrow.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
