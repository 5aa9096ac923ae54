"""SegNet and SegNet-MTAN for dense multi-task prediction (NYUv2, CityScapes).

Architecture of Liu et al. (CVPR 2019, "End-to-End Multi-Task Learning with Attention"), as used by
Nash-MTL, FAMO, FairGrad and COST (methods-cost.md §3.1): a SegNet encoder-decoder with filters
64-128-256-512-512. Each of the 5 encoder stages is a 3x3 conv block (conv + BN + ReLU) into the
stage's width, then one (stage 1-2) or two (stage 3-5) more conv blocks, then 2x2 max-pooling with
indices; the decoder mirrors it with max-unpooling. Every task head is a 3x3 conv (64 -> 64) then a
1x1 conv to the task's channels (segmentation logits, 1 depth channel, 3 normal channels L2-normalised).

``SegNet``: every head reads the shared decoder output (``SegNetTrunk``).
``SegNet-MTAN`` (:class:`SegNetMTAN`): one soft-attention branch per task. At encoder stage j the
branch's 1x1-conv attention mask (conv-BN-ReLU-conv-BN-sigmoid) of [first conv output, previous
branch output] multiplies the stage's last conv output; a shared 3x3 conv block maps it to the next
width, and 2x2 max-pooling follows. The decoder branch upsamples bilinearly, applies a shared conv
block, computes the mask from [unpooled shared features, branch features] and multiplies the stage's
last decoder output. Task i's attention masks are task i's parameters (``trunk_task_parameters``):
only its output depends on them, so they get the plain gradient of L_i like its head, and the shared
parameters (per-task gradients, COST's adapters, PaLoRA's adapters) are the SegNet backbone plus the
conv blocks every branch runs through. The official MTAN/COST code counts the masks as shared (every
parameter outside the prediction heads); with that, task i's gradient has zeros on task j's masks and
COST's LoRA lands on task modules, which the COST paper does not do (Fig. 4: LoRA on the shared backbone).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtlflow.models.base import MultiTaskModel

FILTERS = (64, 128, 256, 512, 512)


def filters(width_divisor: int = 1) -> tuple[int, ...]:
    """The stage widths, divided by ``width_divisor`` (1 = the papers' 64-128-256-512-512; CPU smoke runs
    use a thinner network of the same structure)."""
    return tuple(max(f // width_divisor, 1) for f in FILTERS)


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.BatchNorm2d(out_channels),
                         nn.ReLU(inplace=True))


def attention_mask(in_channels: int, mid_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, mid_channels, 1), nn.BatchNorm2d(mid_channels), nn.ReLU(inplace=True),
                         nn.Conv2d(mid_channels, out_channels, 1), nn.BatchNorm2d(out_channels), nn.Sigmoid())


class DenseHead(nn.Module):
    """3x3 conv then 1x1 conv to ``out_channels``; ``normalise`` L2-normalises the channels (normals)."""

    def __init__(self, out_channels: int, normalise: bool = False, width: int = FILTERS[0]):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.Conv2d(width, out_channels, 1))
        self.normalise = normalise

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv(x)
        return F.normalize(out, p=2, dim=1) if self.normalise else out


class SegNetBackbone(nn.Module):
    """The shared encoder-decoder; :meth:`run` also returns the intermediate maps MTAN attends to."""

    def __init__(self, in_channels: int = 3, width_divisor: int = 1):
        super().__init__()
        f = filters(width_divisor)
        widths_in = (in_channels,) + f[:-1]
        self.enc_first = nn.ModuleList(conv_block(widths_in[i], f[i]) for i in range(5))
        self.enc_rest = nn.ModuleList(
            conv_block(f[i], f[i]) if i < 2 else nn.Sequential(conv_block(f[i], f[i]), conv_block(f[i], f[i]))
            for i in range(5))
        # decoder stage k (k = 0 deepest) maps width f[4-k] to f[3-k] (the last one keeps 64)
        out_widths = (f[3], f[2], f[1], f[0], f[0])
        self.dec_first = nn.ModuleList(conv_block(f[4 - k], out_widths[k]) for k in range(5))
        self.dec_rest = nn.ModuleList(
            conv_block(out_widths[k], out_widths[k]) if k >= 3
            else nn.Sequential(conv_block(out_widths[k], out_widths[k]), conv_block(out_widths[k], out_widths[k]))
            for k in range(5))
        self.out_features = f[0]

    def run(self, x: Tensor) -> dict[str, list[Tensor]]:
        enc_first, enc_last, indices, sizes = [], [], [], []
        h = x
        for first, rest in zip(self.enc_first, self.enc_rest, strict=True):
            a = first(h)
            b = rest(a)
            enc_first.append(a)
            enc_last.append(b)
            sizes.append(b.shape[-2:])
            h, idx = F.max_pool2d(b, 2, 2, return_indices=True)
            indices.append(idx)
        unpooled, dec_last = [], []
        for k, (first, rest) in enumerate(zip(self.dec_first, self.dec_rest, strict=True)):
            up = F.max_unpool2d(h, indices[4 - k], 2, 2, output_size=sizes[4 - k])
            h = rest(first(up))
            unpooled.append(up)
            dec_last.append(h)
        return {"enc_first": enc_first, "enc_last": enc_last, "unpooled": unpooled, "dec_last": dec_last}

    def forward(self, x: Tensor) -> Tensor:
        return self.run(x)["dec_last"][-1]


class MTANAttention(nn.Module):
    """The attention modules of all tasks plus the shared conv blocks between attention stages."""

    def __init__(self, n_tasks: int, width_divisor: int = 1):
        super().__init__()
        f = filters(width_divisor)
        self.n_tasks = n_tasks
        # encoder masks: stage 0 sees the first conv output (64); stage j>0 also the branch (f[j] + f[j])
        self.enc_masks = nn.ModuleList(nn.ModuleList(
            attention_mask(f[j] if j == 0 else 2 * f[j], f[j], f[j]) for j in range(5)) for _ in range(n_tasks))
        self.enc_blocks = nn.ModuleList(conv_block(f[j], f[j + 1] if j < 4 else f[j]) for j in range(5))
        # decoder stage k: branch (width f[4-k] after the shared block maps it) + unpooled shared (f[4-k])
        out_widths = (f[3], f[2], f[1], f[0], f[0])
        self.dec_blocks = nn.ModuleList(conv_block(f[4 - k], out_widths[k]) for k in range(5))
        self.dec_masks = nn.ModuleList(nn.ModuleList(
            attention_mask(f[4 - k] + out_widths[k], out_widths[k], out_widths[k]) for k in range(5))
            for _ in range(n_tasks))

    def forward(self, maps: dict[str, list[Tensor]]) -> Tensor:
        outputs = []
        for t in range(self.n_tasks):
            branch = None
            for j in range(5):
                inp = maps["enc_first"][j] if branch is None else torch.cat([maps["enc_first"][j], branch], dim=1)
                attended = self.enc_masks[t][j](inp) * maps["enc_last"][j]
                branch = F.max_pool2d(self.enc_blocks[j](attended), 2, 2)
            for k in range(5):
                size = maps["unpooled"][k].shape[-2:]
                up = F.interpolate(branch, size=size, mode="bilinear", align_corners=True)
                up = self.dec_blocks[k](up)
                mask = self.dec_masks[t][k](torch.cat([maps["unpooled"][k], up], dim=1))
                branch = mask * maps["dec_last"][k]
            outputs.append(branch)
        return torch.stack(outputs)


class SegNetMTANTrunk(nn.Module):
    """Shared SegNet plus the task attention: ``forward(x) -> [K, B, 64, H, W]`` task-specific features."""

    def __init__(self, n_tasks: int, in_channels: int = 3, width_divisor: int = 1):
        super().__init__()
        self.backbone = SegNetBackbone(in_channels, width_divisor)
        self.attention = MTANAttention(n_tasks, width_divisor)
        self.out_features = self.backbone.out_features

    def forward(self, x: Tensor) -> Tensor:
        return self.attention(self.backbone.run(x))


class SegNetMTAN(MultiTaskModel):
    """SegNet-MTAN: head i reads the attended features of task i."""

    def forward_heads(self, z: Tensor) -> list[Tensor]:
        return [head(z[i]) for i, head in enumerate(self.heads)]

    def trunk_task_parameters(self, index: int) -> list[nn.Parameter]:
        attention = self.trunk.attention
        return [*attention.enc_masks[index].parameters(), *attention.dec_masks[index].parameters()]


def build_segnet(kind: str, heads: Sequence[nn.Module], task_names: Sequence[str],
                 width_divisor: int = 1) -> MultiTaskModel:
    """``segnet`` (shared decoder output for every head) or ``mtan`` (one attention branch per task)."""
    if kind == "mtan":
        return SegNetMTAN(SegNetMTANTrunk(len(task_names), width_divisor=width_divisor), heads, task_names)
    return MultiTaskModel(SegNetBackbone(width_divisor=width_divisor), heads, task_names)
