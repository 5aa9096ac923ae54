"""The message-passing network of the QM9 multi-task experiments (Nash-MTL, FAMO, FairGrad, COST).

Gilmer et al. (2017)'s MPNN as in PyG's ``qm9_nn_conv`` example, which those papers use
(methods-cost.md §3.1): ``Linear(11 -> 64)`` node embedding; 3 rounds of an edge-conditioned
convolution ``NNConv`` (edge network ``5 -> 128 -> 64·64``, mean aggregation) each followed by a GRU
update; ``Set2Set`` readout with 3 processing steps; ``Linear(128 -> 64)``; then one ``Linear(64, 1)``
head per target. The trunk ends with the ReLU after ``Linear(128 -> 64)``, so the heads see the 64
shared features.

The edge network's output depends on the edge attributes only, identical in the 3 rounds; it is
computed once per forward pass and handed to PyG's ``NNConv`` (whose own ``nn`` is the identity).
The function and its gradients are those of calling ``NNConv(nn=edge_network)`` three times, at a
third of the edge-network cost -- the dominant cost of this model (E x 128 x 4096 per round).

For molecules with integer (categorical) atom and bond features (Tox21, QM8), the node and edge
inputs are sums of per-column embeddings instead of the linear layer and raw edge vector.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class CategoricalEncoder(nn.Module):
    """Sum of one embedding per integer column (OGB-style atom/bond encoder)."""

    def __init__(self, vocab_sizes: Sequence[int], dim: int):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for n in vocab_sizes)

    def forward(self, x: Tensor) -> Tensor:
        x = x.long().reshape(x.shape[0], -1)
        return sum(emb(x[:, i]) for i, emb in enumerate(self.embeddings))


class MPNNTrunk(nn.Module):
    """NNConv + GRU message passing and a Set2Set readout; ``forward(batch) -> [B, dim]``."""

    def __init__(self, node_features: int = 11, edge_features: int = 5, dim: int = 64, steps: int = 3,
                 readout_steps: int = 3, edge_hidden: int = 128,
                 node_vocab: Sequence[int] | None = None, edge_vocab: Sequence[int] | None = None,
                 edge_embedding: int = 16):
        super().__init__()
        from torch_geometric.nn import NNConv, Set2Set

        self.node_encoder = CategoricalEncoder(node_vocab, dim) if node_vocab else nn.Linear(node_features, dim)
        self.edge_encoder = CategoricalEncoder(edge_vocab, edge_embedding) if edge_vocab else None
        edge_in = edge_embedding if edge_vocab else edge_features
        self.edge_network = nn.Sequential(nn.Linear(edge_in, edge_hidden), nn.ReLU(),
                                          nn.Linear(edge_hidden, dim * dim))
        self.conv = NNConv(dim, dim, nn.Identity(), aggr="mean")
        self.gru = nn.GRU(dim, dim)
        self.readout = Set2Set(dim, processing_steps=readout_steps)
        self.project = nn.Linear(2 * dim, dim)
        self.steps = steps
        self.out_features = dim

    def forward(self, batch) -> Tensor:
        x = batch.x if self.edge_encoder is not None else batch.x.float()
        out = torch.relu(self.node_encoder(x))
        edge_attr = self.edge_encoder(batch.edge_attr) if self.edge_encoder is not None else batch.edge_attr.float()
        edge_weights = self.edge_network(edge_attr)  # [E, dim * dim], the same in every round
        hidden = out.unsqueeze(0)
        for _ in range(self.steps):
            message = torch.relu(self.conv(out, batch.edge_index, edge_weights))
            out, hidden = self.gru(message.unsqueeze(0), hidden)
            out = out.squeeze(0)
        pooled = self.readout(out, batch.batch)
        return torch.relu(self.project(pooled))


def regression_heads(in_features: int, n_tasks: int) -> list[nn.Module]:
    """One ``Linear(in_features, 1)`` per task."""
    return [nn.Linear(in_features, 1) for _ in range(n_tasks)]
