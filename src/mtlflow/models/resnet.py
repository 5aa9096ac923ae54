"""torchvision ResNets as shared trunks, with weights only from a local file (nothing is ever downloaded).

:class:`ResNetTrunk` is the image trunk of task specs (ResNet-18 or -50 without its classifier: the
global-average-pooled 512 or 2048 features). :class:`ResNet18Encoder` is the shared encoder of the
Office-31/Office-Home experiments (LibMTL's ``examples/office``): ResNet-18, then a hidden layer
``Linear(512, 512)`` (weights ~ N(0, 0.005), bias 0.1) + BatchNorm1d + ReLU + Dropout(0.5). LibMTL starts
from ImageNet weights; here a ``weights_path`` (a torchvision ``state_dict`` file, e.g. on the cluster's
data volume) gives pretrained weights, and without one the trunk starts from torchvision's random init.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from mtlflow.core.errors import DataError

#: depth -> width of the pooled features
RESNET_FEATURES = {18: 512, 50: 2048}


def resnet_backbone(depth: int, weights_path: str | None = None) -> nn.Module:
    """torchvision's ResNet-``depth`` with ``fc`` replaced by the identity; its weights from ``weights_path``
    (a state_dict of the same architecture; its ``fc.*`` entries are not used) or random."""
    from torchvision.models import resnet18, resnet50

    backbone = {18: resnet18, 50: resnet50}[depth](weights=None)
    backbone.fc = nn.Identity()
    if weights_path:
        backbone.load_state_dict(_checked_state(Path(weights_path), depth, backbone.state_dict()))
    return backbone


def _checked_state(path: Path, depth: int, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state_dict in ``path`` without ``fc.*``, or a one-line DataError saying why it does not fit."""
    fix = f"give a torchvision resnet{depth} state_dict (torch.save(torchvision.models.resnet{depth}().state_dict(), " \
          "FILE))"
    if not path.is_file():
        raise DataError(f"ResNet-{depth} weights not found: {path}; {fix}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for files that are not its format
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"ResNet-{depth} weights {path} cannot be read as a state_dict ({reason[:160]}); {fix}") \
            from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DataError(f"ResNet-{depth} weights {path} hold a {type(state).__name__}, not a state_dict of tensors; "
                        f"{fix}")
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    reshaped = sorted(k for k in set(state) & set(expected) if state[k].shape != expected[k].shape)
    problems = [f"{len(keys)} {what}, e.g. {keys[0]}" for keys, what in
                ((missing, "missing keys"), (unexpected, "unexpected keys"), (reshaped, "shapes differ"))
                if keys]
    if problems:
        raise DataError(f"ResNet-{depth} weights {path} do not fit torchvision resnet{depth} "
                        f"({'; '.join(problems)}); {fix}")
    return state


class ResNetTrunk(nn.Module):
    """ResNet-18 or -50 features (global-average-pooled, 512 or 2048 wide) of ``[B, 3, H, W]`` images."""

    def __init__(self, depth: int = 18, weights_path: str | None = None):
        super().__init__()
        if depth not in RESNET_FEATURES:
            raise ValueError(f"ResNet depth {depth} is not built in; use one of {sorted(RESNET_FEATURES)}")
        self.backbone = resnet_backbone(depth, weights_path)
        self.out_features = RESNET_FEATURES[depth]

    def forward(self, x):
        return self.backbone(x)


class ResNet18Encoder(nn.Module):
    def __init__(self, weights_path: str | None = None, hidden: int = 512):
        super().__init__()
        self.backbone = resnet_backbone(18, weights_path)
        linear = nn.Linear(512, hidden)
        nn.init.normal_(linear.weight, 0.0, 0.005)
        nn.init.constant_(linear.bias, 0.1)
        self.hidden = nn.Sequential(linear, nn.BatchNorm1d(hidden), nn.ReLU(inplace=True), nn.Dropout(0.5))
        self.out_features = hidden

    def forward(self, x):
        return self.hidden(self.backbone(x))
