"""A Lightning run as a user writes one, with its defaults: ``log_every_n_steps`` 50, a ``CSVLogger`` (flushed every
100 steps) and a ``ThroughputMonitor`` that knows the model's FLOPs per batch (``measure_flops``). Under a non-TTY
Lightning prints nothing during ``fit``: its progress is the logger's ``metrics.csv``.

    python -m tests.support.realjobs.lightning_run --steps 800 --out DIR
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import lightning as L
    from lightning.fabric.utilities.throughput import measure_flops
    from lightning.pytorch.callbacks import ThroughputMonitor
    from lightning.pytorch.loggers import CSVLogger

    from tests.support.realjobs.model import gpt2, tokens

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = gpt2()
            self.flops_per_batch = 0

        def setup(self, stage: str) -> None:
            # Lightning's recipe: count one batch's forward and backward on a meta-device copy.
            with torch.device("meta"):
                meta = gpt2()
                batch = torch.zeros(args.batch, self.model.config.n_positions, dtype=torch.long)
            self.flops_per_batch = measure_flops(
                meta, lambda: meta(input_ids=batch, labels=batch), lambda output: output.loss
            )

        def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
            loss = self.model(input_ids=batch, labels=batch).loss
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    loader = torch.utils.data.DataLoader(tokens(4096), batch_size=args.batch, shuffle=True)
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch.size(0), length_fn=lambda batch: batch.numel())
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        logger=CSVLogger(args.out, name="csv", version=0),
        callbacks=[monitor],
        enable_checkpointing=False,
    )
    trainer.fit(Module(), loader)


if __name__ == "__main__":
    main()
