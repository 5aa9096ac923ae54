"""The shared encoder of the Office-31/Office-Home experiments (LibMTL's ``examples/office``).

ResNet-18 from torchvision without its classifier (global-average-pooled 512 features), then a hidden
layer ``Linear(512, 512)`` (weights ~ N(0, 0.005), bias 0.1) + BatchNorm1d + ReLU + Dropout(0.5).
LibMTL starts from ImageNet weights; nothing is downloaded here (``weights=None``): pass
``weights_path`` (a torchvision ResNet-18 ``state_dict`` file, e.g. on the cluster's data volume) to
start from pretrained weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from mtlflow.core.errors import DataError


class ResNet18Encoder(nn.Module):
    def __init__(self, weights_path: str | None = None, hidden: int = 512):
        super().__init__()
        from torchvision.models import resnet18

        backbone = resnet18(weights=None)
        if weights_path:
            path = Path(weights_path)
            if not path.is_file():
                raise DataError(f"ResNet-18 weights not found: expected {path}; pass an existing state_dict file")
            state = torch.load(path, map_location="cpu", weights_only=True)
            backbone.load_state_dict({k: v for k, v in state.items() if not k.startswith("fc.")}, strict=False)
        backbone.fc = nn.Identity()
        self.backbone = backbone
        linear = nn.Linear(512, hidden)
        nn.init.normal_(linear.weight, 0.0, 0.005)
        nn.init.constant_(linear.bias, 0.1)
        self.hidden = nn.Sequential(linear, nn.BatchNorm1d(hidden), nn.ReLU(inplace=True), nn.Dropout(0.5))
        self.out_features = hidden

    def forward(self, x):
        return self.hidden(self.backbone(x))
