"""The table trunk with learned categorical embeddings: one ``nn.Embedding`` per categorical column, its
vectors concatenated with the numeric features, then the MLP (:class:`mtlflow.models.mlp.MLPTrunk`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mtlflow.models.mlp import MLPTrunk


class EmbeddingMLPTrunk(nn.Module):
    """Input ``[B, numeric + C]``: the numeric features, then one category code per categorical column.

    The codes travel in the same float tensor as the numeric features (exact integers up to 2**24), so a
    batch stays one tensor for the loaders, devices and distributed training. Code 0 is the unknown
    category (missing, or not seen in the training split); codes ``1..n`` are the training categories.
    """

    def __init__(self, numeric_width: int, cardinalities: Sequence[int], dims: Sequence[int],
                 widths: Sequence[int] = (256, 256), dropout: float = 0.0):
        super().__init__()
        if len(cardinalities) != len(dims):
            raise ValueError(f"{len(cardinalities)} categorical columns but {len(dims)} embedding widths")
        self.numeric_width = numeric_width
        self.embeddings = nn.ModuleList(nn.Embedding(n + 1, d) for n, d in zip(cardinalities, dims, strict=True))
        self.mlp = MLPTrunk(numeric_width + sum(dims), widths, dropout)
        self.out_features = self.mlp.out_features

    def forward(self, x):
        codes = x[:, self.numeric_width:].long()
        embedded = [table(codes[:, i]) for i, table in enumerate(self.embeddings)]
        return self.mlp(torch.cat([x[:, :self.numeric_width], *embedded], dim=1))
