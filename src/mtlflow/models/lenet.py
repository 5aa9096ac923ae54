"""The LeNet-style multi-task network of Sener & Koltun (2018) for MultiMNIST, widened slightly."""

from __future__ import annotations

from torch import nn


class LeNetTrunk(nn.Module):
    """Two 5x5 conv layers with max-pooling, then one fully connected layer: the shared trunk."""

    def __init__(self, in_channels: int = 1, image_size: int = 36, width: int = 16, features: int = 128):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=5), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(width, 2 * width, kernel_size=5), nn.MaxPool2d(2), nn.ReLU(),
        )
        side = ((image_size - 4) // 2 - 4) // 2
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * side * side, features), nn.ReLU())
        self.out_features = features

    def forward(self, x):
        return self.fc(self.conv(x))


def classification_head(in_features: int, n_classes: int, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
