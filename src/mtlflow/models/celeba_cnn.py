"""The CelebA network of the Nash-MTL/FAMO/FairGrad/COST experiments (methods-cost.md §3.1).

A "9-layer CNN": 7 conv layers (3x3, padding 1, no bias, each followed by BatchNorm and ReLU) of
widths 64 | 128, 128 | 256, 256 | 512, 512 with 2x2 max-pooling after the 1st, 3rd and 5th,
global average pooling, then 2 fully connected layers 512 -> 512 (no bias, BatchNorm1d, ReLU). ``width``
scales every layer (64, the default, is the papers' network; ``mtlflow bench --width`` times narrower
copies of the same network on the CPU).
Each of the 40 attributes has a ``Linear(512, 1)`` head; the papers apply a sigmoid and BCE, here the
head emits the logit and the loss is BCE-with-logits (the same function, numerically stabler).
"""

from __future__ import annotations

from torch import nn

#: conv widths in units of ``width`` (64: 64 | 128, 128 | 256, 256 | 512, 512)
WIDTH_MULTIPLIERS = (1, 2, 2, 4, 4, 8, 8)
POOL_AFTER = {0, 2, 4}


class CelebACNN(nn.Module):
    def __init__(self, in_channels: int = 3, width: int = 64):
        super().__init__()
        layers: list[nn.Module] = []
        previous, features = in_channels, 8 * width
        for i, multiplier in enumerate(WIDTH_MULTIPLIERS):
            channels = multiplier * width
            layers += [nn.Conv2d(previous, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                       nn.ReLU(inplace=True)]
            if i in POOL_AFTER:
                layers.append(nn.MaxPool2d(2, 2))
            previous = channels
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        for _ in range(2):
            layers += [nn.Linear(previous, features, bias=False), nn.BatchNorm1d(features), nn.ReLU(inplace=True)]
            previous = features
        self.net = nn.Sequential(*layers)
        self.out_features = features

    def forward(self, x):
        return self.net(x)
