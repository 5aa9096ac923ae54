"""The MLP trunk of tabular data: ``in_features -> widths[0] -> ... -> widths[-1]`` with ReLU."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


class MLPTrunk(nn.Module):
    """Linear + ReLU per hidden width (+ Dropout when ``dropout > 0``); ``out_features`` is the last width."""

    def __init__(self, in_features: int, widths: Sequence[int] = (256, 256), dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        for width in widths:
            layers += [nn.Linear(in_features, width), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            in_features = width
        self.net = nn.Sequential(*layers)
        self.out_features = in_features

    def forward(self, x):
        return self.net(x)
