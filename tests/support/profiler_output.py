"""Produces, by running the frameworks' own code on the CPU, the profiler output kept as fixtures where no real paste
of it was found whole: a PyTorch profiler table (``prof.key_averages().table()``) and Lightning's AdvancedProfiler
report. The data set sleeps 10 ms per sample, so the data loader's rows carry a wait the fixture can state.

    python -m tests.support.profiler_output torch            # the table, on stdout
    python -m tests.support.profiler_output lightning DIR    # DIR/fit-advanced.txt

tests/fixtures/logs/real/formats.txt keeps what these printed (torch 2.13.0+cpu, lightning 2.6.6), marked produced.
Neither is run by the tests: the fixtures are the record, as a paste is.
"""

from __future__ import annotations

import sys
import time

SAMPLE_SECONDS = 0.01


def _data(samples: int):
    import torch
    from torch.utils.data import Dataset

    class SlowData(Dataset):
        def __len__(self) -> int:
            return samples

        def __getitem__(self, index: int):
            time.sleep(SAMPLE_SECONDS)
            return torch.randn(16), torch.randn(1)

    return SlowData()


def torch_table() -> str:
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for x, y in DataLoader(_data(64), batch_size=8):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return prof.key_averages().table(sort_by="cpu_time_total", row_limit=12)


def lightning_report(directory: str) -> None:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.profilers import AdvancedProfiler
    from torch.utils.data import DataLoader

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch, _index):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        profiler=AdvancedProfiler(dirpath=directory, filename="advanced", line_count_restriction=0.02),
    )
    trainer.fit(Model(), DataLoader(_data(32), batch_size=4))


if __name__ == "__main__":
    if sys.argv[1:2] == ["torch"]:
        print(torch_table())
    elif sys.argv[1:2] == ["lightning"] and len(sys.argv) == 3:
        lightning_report(sys.argv[2])
    else:
        sys.exit("usage: python -m tests.support.profiler_output torch | lightning DIR")
