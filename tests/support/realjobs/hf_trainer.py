"""A Hugging Face ``Trainer`` run as a user writes one: its progress is the dicts its console callback prints every
``logging_steps`` (with ``include_num_input_tokens_seen``), and at the end ``train_runtime`` and ``total_flos``.

    python -m tests.support.realjobs.hf_trainer --steps 600 --logging-steps 100 --out DIR [--slow-loader 0.05]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


class Sequences(torch.utils.data.Dataset):
    def __init__(self, data: torch.Tensor, delay: float):
        self.data, self.delay = data, delay

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict:
        if self.delay:
            time.sleep(self.delay)  # a slow input pipeline: the loop waits in next() for this
        row = self.data[index]
        return {"input_ids": row, "labels": row}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--logging-steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--slow-loader", type=float, default=0.0, help="seconds each sample's read waits")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import Trainer, TrainingArguments

    from tests.support.realjobs.model import gpt2, tokens

    training = TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        logging_steps=args.logging_steps,
        logging_first_step=True,  # a line after the first step too: the run's rate is seen from its start
        include_num_input_tokens_seen=True,
        learning_rate=1e-3,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=gpt2(), args=training, train_dataset=Sequences(tokens(4096), args.slow_loader))
    result = trainer.train()
    # The Trainer's own account, for the test's truth: what it printed, kept as JSON beside the log.
    with open(f"{args.out}/trainer_result.json", "w") as handle:
        json.dump({"metrics": result.metrics, "log_history": trainer.state.log_history}, handle)


if __name__ == "__main__":
    main()
