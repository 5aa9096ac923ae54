"""mtlflow's library mode in a plain PyTorch training loop: the loop stays the user's, one call replaces
``sum(losses).backward()``.

    python examples/library/plain_loop.py --method upgrad
    python examples/library/plain_loop.py --method famo --epochs 5

Every hook is called, so any method that runs in library mode can be swapped in with ``--method``
(docs/guides/library.md lists the few that cannot).
"""

from __future__ import annotations

import torch
from synthetic import TASKS, MultiTaskNet, command_line, dataset, print_epoch
from torch.utils.data import DataLoader

from mtlflow import MTLBackward


def main() -> None:
    args = command_line(__doc__.splitlines()[0], method="upgrad", epochs=8)

    torch.manual_seed(args.seed)
    model = MultiTaskNet()
    loader = DataLoader(dataset(), batch_size=64, shuffle=True)
    # the trunk is what every task shares; each head belongs to one task
    mtl = MTLBackward(args.method, shared_params=model.trunk, task_params=list(model.heads), seed=args.seed)
    # the method's learned tensors (UW, IMTL, GradNorm; none for most methods) are trained with the model
    optimizer = torch.optim.Adam([*model.parameters(), *mtl.parameters()], lr=1e-2)

    for epoch in range(1, args.epochs + 1):
        totals = torch.zeros(len(TASKS))
        for x, targets in loader:
            optimizer.zero_grad()
            losses = model.task_losses(x, targets)
            result = mtl(losses)  # writes .grad of the trunk (the method's update) and of the heads
            optimizer.step()
            # FAMO compares the losses of this batch before and after the step; other methods ignore it
            mtl.after_optimizer_step(recompute_losses=lambda: model.task_losses(x, targets))
            totals += result.losses.float() * len(x)
        mtl.epoch_end()  # DWA, STCH and ExcessMTL update per epoch
        print_epoch(epoch, totals / len(loader.dataset))


if __name__ == "__main__":
    main()
