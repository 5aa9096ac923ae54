"""mtlflow's library mode in a Lightning module with manual optimisation (``automatic_optimization = False``):
the call replaces ``self.manual_backward(loss)``, the method's state travels in Lightning's checkpoints.

    python examples/library/lightning_manual.py --method uw --epochs 4

The run trains ``--epochs`` epochs, saves a checkpoint, then resumes from it in a new module and a new
``lightning.Trainer`` for one more epoch, as a restarted job would.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from synthetic import MultiTaskNet, command_line, dataset, print_epoch
from torch import Tensor
from torch.utils.data import DataLoader

from mtlflow import MTLBackward


class MultiTaskModule(L.LightningModule):
    def __init__(self, method: str, seed: int):
        super().__init__()
        self.automatic_optimization = False
        self.net = MultiTaskNet()
        self.mtl = MTLBackward(method, shared_params=self.net.trunk, task_params=list(self.net.heads), seed=seed)
        self.epoch_losses: list[Tensor] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Lightning has moved the model to its device by now: the method's tensors follow before the
        # optimizer takes its learned ones (UW's log-variances)
        self.mtl.to(self.device)
        return torch.optim.Adam([*self.net.parameters(), *self.mtl.parameters()], lr=1e-2)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, targets = batch
        optimizer = self.optimizers()
        optimizer.zero_grad()
        result = self.mtl(self.net.task_losses(x, targets))  # instead of self.manual_backward(loss)
        optimizer.step()
        self.mtl.after_optimizer_step(recompute_losses=lambda: self.net.task_losses(x, targets))
        self.epoch_losses.append(result.losses)

    def on_train_epoch_end(self) -> None:
        self.mtl.epoch_end()
        print_epoch(self.current_epoch + 1, torch.stack(self.epoch_losses).mean(0))
        self.epoch_losses.clear()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["mtlflow"] = self.mtl.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.mtl.load_state_dict(checkpoint["mtlflow"])


def fit(module: MultiTaskModule, loader: DataLoader, epochs: int, checkpoint: Path | None = None) -> L.Trainer:
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader, ckpt_path=checkpoint)
    return trainer


def main() -> None:
    args = command_line(__doc__.splitlines()[0], method="uw", epochs=4)

    L.seed_everything(args.seed, verbose=False)
    loader = DataLoader(dataset(), batch_size=64, shuffle=True)
    trainer = fit(MultiTaskModule(args.method, args.seed), loader, args.epochs)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "last.ckpt"
        trainer.save_checkpoint(checkpoint)
        resumed = MultiTaskModule(args.method, args.seed)
        fit(resumed, loader, args.epochs + 1, checkpoint)
    print(f"resumed at step {resumed.mtl.step - len(loader)} and trained one more epoch")


if __name__ == "__main__":
    main()
