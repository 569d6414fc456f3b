"""A data-parallel job under ``torchrun`` on CPU ranks (gloo), as the tests launch it::

    python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1 --monitor-interval 0.1 \\
        -m tests.support.realjobs.ddp_job --out DIR --steps 300 --peak-flops 5e10 [--log-style megatron]

Its log is rank 0's stdout in torchtitan's form (``--log-style titan``: its logger prefix, start-up, step,
checkpoint save and load lines, word for word as torchtitan prints them), or Megatron-LM's (``megatron``: the
iteration line on the last rank, and with ``--timing-log-level 2`` its ``(min, max) time across ranks`` timers,
``batch-generator`` among them). Every ``--checkpoint-every`` steps the ranks save model and optimizer with
``torch.distributed.checkpoint`` to ``DIR/ckpt/step-N``; a restarted group loads the newest complete one.

Each rank also writes what it did, with its own clock, to ``DIR/truth-rank<N>.jsonl`` (one JSON object a line:
``event`` start, load, save, step, exit; ``time``, Unix seconds; ``end`` for timed events): the truth a test compares
the exporter's figures with. Nothing of the exporter is imported.

The start-up line that torchtitan prints first among those the exporter reads (``Peak FLOPS used for computing
MFU``) is printed here as soon as the process starts, before torch is imported: a run is seen from its start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import threading
import time

START = time.time()
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def titan(message: str) -> None:
    """torchtitan/tools/logging.py's format: ``[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s``."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    print(f"[titan] {stamp} - root - INFO - {message}", flush=True)


def megatron_stamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")


class Truth:
    def __init__(self, out: str):
        self.handle = open(os.path.join(out, f"truth-rank{RANK}.jsonl"), "a", buffering=1)

    def __call__(self, event: str, at: float, **fields: object) -> None:
        record = {"event": event, "time": at, "pid": os.getpid(), "restart": RESTART, **fields}
        self.handle.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    parser.add_argument("--log-freq", type=int, default=10, help="torchtitan's metrics.log_freq default")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--peak-flops", type=float, required=True, help="per device, for the printed MFU")
    parser.add_argument("--log-style", choices=("titan", "megatron"), default="titan")
    parser.add_argument("--slow-loader", type=float, default=0.0, help="seconds each sample's read waits")
    parser.add_argument("--slow-after", type=int, default=0, help="the loader is slow from this step on")
    args = parser.parse_args()
    titan_style = args.log_style == "titan"
    os.makedirs(args.out, exist_ok=True)
    truth = Truth(args.out)
    truth("start", START)
    if RANK == 0 and titan_style:
        titan(f"Peak FLOPS used for computing MFU: {args.peak_flops:.3e}")

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel

    from tests.support.realjobs.model import HEADS, LAYERS, SEQ, WIDTH, gpt2, matmul_params, tokens

    torch.set_num_threads(1)
    # The group's rendezvous under a prefix of its own per restart: gloo reads each peer's address from the store,
    # and a restarted rank that reads the killed one's stale entry connects to a dead port and fails the group.
    store = dist.PrefixStore(
        f"ddp_job/restart{RESTART}",
        dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, use_libuv=False),
    )
    dist.init_process_group("gloo", store=store, rank=RANK, world_size=WORLD)
    model = gpt2()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # torchtitan's FLOPs per token: 6 x matmul parameters + 12 x layers x heads x head dim x sequence (not halved).
    flops_per_token = 6 * matmul_params() + 12 * LAYERS * HEADS * (WIDTH // HEADS) * SEQ
    global_batch = args.batch * WORLD
    if RANK == 0 and titan_style:
        titan(
            f"\x1b[34mModel gpt2 tiny \x1b[31msize: {sum(p.numel() for p in model.parameters()):,} total parameters\x1b[39m"
        )
        titan(
            f"Trainer is initialized with local batch size {args.batch}, global batch size {global_batch}, "
            f"gradient accumulation steps 1, sequence length {SEQ}, total steps {args.steps} (warmup 0)"
        )

    checkpoints = os.path.join(args.out, "ckpt")
    done = sorted(
        (int(name.split("-")[1]) for name in os.listdir(checkpoints) if name.startswith("step-"))
        if os.path.isdir(checkpoints)
        else []
    )
    done = [s for s in done if os.path.exists(os.path.join(checkpoints, f"step-{s}", ".complete"))]
    step = 0
    if done:
        step = done[-1]
        where = os.path.join(checkpoints, f"step-{step}")
        began = time.time()
        if RANK == 0:
            if titan_style:
                titan(f"Loading the checkpoint from {where}.")
            else:
                print(f" loading checkpoint from {checkpoints} at iteration {step}", flush=True)
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=where)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        dist.barrier()
        ended = time.time()
        truth("load", began, end=ended, step=step)
        if RANK == 0:
            if titan_style:
                titan(f"Finished loading the checkpoint in {ended - began:.2f} seconds.")
            else:
                print(
                    f"  successfully loaded checkpoint from {checkpoints} [ t 1/1, p 1/1 ] at iteration {step}",
                    flush=True,
                )
    if RANK == 0 and titan_style:
        titan(f"Training starts at step {step + 1}")

    truth("train", time.time(), step=step)  # the loop starts: what came before was start-up (and the load)
    data = tokens(4096)
    generator = torch.Generator().manual_seed(1000 + RANK + 17 * step)
    waited = 0.0  # this rank's seconds in its loader since the last log line
    tokens_since = 0
    logged_at = time.perf_counter()
    while step < args.steps:
        step += 1
        began = time.perf_counter()
        rows = torch.randint(0, len(data), (args.batch,), generator=generator)
        if args.slow_loader and step >= args.slow_after:
            time.sleep(args.slow_loader * args.batch)  # a slow input pipeline: each sample's read waits
        batch = data[rows]
        wait = time.perf_counter() - began
        waited += wait
        loss = ddp(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tokens_since += batch.numel()
        truth("step", time.time(), step=step, wait=wait, seconds=time.perf_counter() - began)
        if step == 1 or step % args.log_freq == 0:
            now = time.perf_counter()
            interval = now - logged_at
            tps = tokens_since / interval  # tokens per second per rank, as torchtitan's
            worst = torch.tensor([waited])
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            if titan_style and RANK == 0:
                mfu = 100 * flops_per_token * tps / args.peak_flops
                titan(
                    f"\x1b[31mstep: {step:2}  \x1b[32mloss: {loss.item():8.5f}  \x1b[38;2;180;60;0mgrad_norm: "
                    f"{0.0:7.4f}  \x1b[38;2;54;234;195mmemory:  0.00GiB(0.00%)  \x1b[34mtps: {round(tps):,}  "
                    f"\x1b[36mtflops: {flops_per_token * tps / 1e12:,.2f}  \x1b[35mmfu: {mfu:.2f}%\x1b[39m"
                )
            elif not titan_style and RANK == WORLD - 1:
                iterations = args.log_freq if step > 1 else 1
                line = f" [{megatron_stamp()}] iteration {step:8d}/{args.steps:8d} |"
                line += f" consumed samples: {step * global_batch:12d} |"
                line += f" elapsed time per iteration (ms): {interval * 1000 / iterations:.1f} |"
                line += f" learning rate: {1e-3:.6E} | global batch size: {global_batch:5d} |"
                line += f" lm loss: {loss.item():.6E} | loss scale: 1.0 | grad norm: 0.000 |"
                line += " number of skipped iterations:   0 | number of nan iterations:   0 |"
                print(line, flush=True)
                # --timing-log-level 2: the timers' mean milliseconds per iteration over the interval.
                print("(min, max) time across ranks (ms):", flush=True)
                print(
                    f"    {'batch-generator '.ljust(48, '.')}: ({0.0:.2f}, {worst.item() * 1000 / iterations:.2f})",
                    flush=True,
                )
            waited, tokens_since, logged_at = 0.0, 0, time.perf_counter()
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
            where = os.path.join(checkpoints, f"step-{step}")
            began = time.time()
            if RANK == 0:
                if titan_style:
                    titan("Saving the checkpoint.")
                else:
                    print(
                        f"[{megatron_stamp()}] saving checkpoint at iteration {step:7d} to {checkpoints} in torch_dist format",
                        flush=True,
                    )
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=where)
            dist.barrier()
            ended = time.time()
            if RANK == 0:
                open(os.path.join(where, ".complete"), "w").close()
                if titan_style:
                    titan(f"Finished saving the checkpoint in {ended - began:.2f} seconds.")
                else:
                    print(
                        f"  [{megatron_stamp()}] successfully saved checkpoint from iteration {step:7d} to "
                        f"{checkpoints} [ t 1/1, p 1/1 ]",
                        flush=True,
                    )
            truth("save", began, end=ended, step=step)
            logged_at = time.perf_counter()  # the save is not in the next interval's rate, as torchtitan's
    if RANK == 0 and titan_style:
        titan("Training completed")
    truth("exit", time.time(), step=step)
    # Gloo's teardown now and then never returns (github.com/pytorch/pytorch/issues/75097), which would hold the job
    # open past the test's wait: a rank whose work is done and recorded leaves after a minute of it.
    sys.stdout.flush()
    leave = threading.Timer(60.0, os._exit, args=(0,))
    leave.daemon = True
    leave.start()
    dist.barrier()  # no rank leaves while another still needs the store
    dist.destroy_process_group()
    leave.cancel()


if __name__ == "__main__":
    sys.exit(main())
