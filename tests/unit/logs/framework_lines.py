"""Log lines assembled strictly from each framework's own format strings (../shared/reference/framework-logs.md,
which quotes them verbatim with their repository, path and commit); only the numbers are ours.

Each function below reproduces one format string; its docstring names where it is from.
"""

from __future__ import annotations

import datetime as dt
import time

# torchtitan/tools/utils.py Color
RED, GREEN, BLUE, MAGENTA, CYAN, RESET = "\033[31m", "\033[32m", "\033[34m", "\033[35m", "\033[36m", "\033[39m"
ORANGE, TURQUOISE = "\033[38;2;180;60;0m", "\033[38;2;54;234;195m"


def asctime(t: float) -> str:
    """Python logging's default asctime: ``%Y-%m-%d %H:%M:%S,mmm`` in local time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t * 1000) % 1000:03d}"


def rfc3339(t: float) -> str:
    whole = int(t)
    ns = int(round((t - whole) * 1e9))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ns:09d}Z"


def cri(t: float, text: str, stream: str = "stdout", tag: str = "F") -> str:
    """kubelet parseCRILog's form: ``2016-10-06T00:17:09.669794202Z stdout P log content 1``."""
    return f"{rfc3339(t)} {stream} {tag} {text}"


# -- torchtitan (pytorch/torchtitan b5bcd76c66d0) --------------------------------------------------------------
def titan_logger(t: float, message: str) -> str:
    """torchtitan/tools/logging.py: ``"[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"``."""
    return f"[titan] {asctime(t)} - root - INFO - {message}"


def titan_step(step, loss, grad_norm, gib, pct, tps, tflops, mfu, color=True) -> str:
    """torchtitan/components/metrics.py MetricsProcessor.log (HEAD)."""
    c = (RED, GREEN, ORANGE, TURQUOISE, BLUE, CYAN, MAGENTA, RESET) if color else ("",) * 8
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return (
        f"{c[0]}step: {step:2}  "
        f"{c[1]}loss: {loss:8.5f}  "
        f"{c[2]}grad_norm: {grad_norm:7.4f}  "
        f"{c[3]}memory: {gib:5.2f}GiB"
        f"({pct:.2f}%)  "
        f"{c[4]}tps: {round(tps):,}  "
        f"{c[5]}tflops: {tflops:,.2f}  "
        f"{c[6]}mfu: {mfu_str}{c[7]}"
    )


def titan_init_v02(local_batch, global_batch, accum, seq_len, steps, warmup) -> str:
    """torchtitan/trainer.py v0.1.0-v0.2.2 init line (without v0.1.0's trailing dot)."""
    return (
        "Trainer is initialized with "
        f"local batch size {local_batch}, "
        f"global batch size {global_batch}, "
        f"gradient accumulation steps {accum}, "
        f"sequence length {seq_len}, "
        f"total steps {steps} "
        f"(warmup {warmup})"
    )


def titan_model_size(name, flavor, count) -> str:
    """torchtitan/trainer.py: ``f"{color.blue}Model {model_spec.name} {model_spec.flavor} "
    f"{color.red}size: {model_param_count:,} total parameters{color.reset}"``."""
    return f"{BLUE}Model {name} {flavor} {RED}size: {count:,} total parameters{RESET}"


def titan_peak(peak: float) -> str:
    return f"Peak FLOPS used for computing MFU: {peak:.3e}"


def titan_save_begin(phase="saving") -> str:
    """torchtitan/components/checkpointer/dcp.py _save: ``f"{checkpoint_phase.capitalize()} the checkpoint."``."""
    return f"{phase.capitalize()} the checkpoint."


def titan_save_end(seconds, phase="saving") -> str:
    return f"Finished {phase} the checkpoint in {seconds:.2f} seconds."


# -- Megatron-LM (NVIDIA/Megatron-LM d98e8a64ddf3) --------------------------------------------------------------
def megatron_stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S.%f")


def megatron_iteration(t, iteration, train_iters, consumed, elapsed_s, tflops, lr, batch, loss, stamp=True) -> str:
    """megatron/training/training.py training_log (HEAD; ``stamp=False``: before f427c6f0a1; tflops None: without
    --log-throughput)."""
    log_string = f" [{megatron_stamp(t)}]" if stamp else ""
    log_string += " iteration {:8d}/{:8d} |".format(iteration, train_iters)
    log_string += " consumed samples: {:12d} |".format(consumed)
    log_string += " elapsed time per iteration (ms): {:.1f} |".format(elapsed_s * 1000.0)
    if tflops is not None:
        log_string += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    log_string += f" learning rate: {lr:.6E} |"
    log_string += f" global batch size: {batch:5d} |"
    log_string += " {}: {:.6E} |".format("lm loss", loss)
    log_string += f" loss scale: {1.0:.1f} |"
    log_string += f" grad norm: {0.456:.3f} |"
    log_string += " number of skipped iterations: {:3d} |".format(0)
    log_string += " number of nan iterations: {:3d} |".format(0)
    return log_string


def megatron_args(values: dict) -> list[str]:
    """megatron/training/arguments.py _print_args: the title line, then ``'  {} {} {}'.format(arg, dots, value)``
    with ``dots = '.' * (48 - len(arg))``."""
    lines = [f"------------------------ {'arguments'} ------------------------"]
    for arg in sorted(values):
        dots = "." * (48 - len(arg))
        lines.append("  {} {} {}".format(arg, dots, values[arg]))
    lines.append("-------------------- end of arguments ---------------------")
    return lines


def megatron_save_begin(t, iteration, save_dir) -> str:
    """megatron/training/checkpointing.py save_checkpoint (HEAD)."""
    return f"[{megatron_stamp(t)}] saving checkpoint at iteration {iteration:7d} to {save_dir} in torch_dist format"


def megatron_save_end(t, iteration, save_dir) -> str:
    return (
        f"  [{megatron_stamp(t)}] successfully saved "
        f"checkpoint from iteration {int(iteration):7d} to {save_dir} "
        f"[ t {1}/{8}, "
        f"gtp_remat {1}/{1}, "
        f"p {1}/{4} ]"
    )


# -- HF transformers Trainer (5.25.0 / 4.57.1 wheels) -------------------------------------------------------------
def hf_log(logs: dict, v5: bool = True) -> str:
    """ProgressCallback.on_log: ``self.training_bar.write(str(shallow_logs))``; >= 5.0.0 formats floats
    ``f"{v:.4g}"`` as strings."""
    shallow = {}
    for k, v in logs.items():
        shallow[k] = f"{v:.4g}" if v5 and isinstance(v, float) else v
    return str(shallow)


def tqdm_bar(n: int, total: int) -> str:
    """tqdm's format_meter ``{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]``."""
    pct = int(100 * n / total)
    bar = ("█" * (pct // 10)).ljust(10)
    return f"{pct:3d}%|{bar}| {n}/{total} [01:23<26:15,  1.66s/it]"


def hf_save(output_dir: str) -> str:
    """Trainer._save: ``logger.info(f"Saving model checkpoint to {output_dir}")``; 5.25.0's ``[transformers] ``."""
    return f"[transformers] Saving model checkpoint to {output_dir}"


# -- NeMo 2 (NVIDIA/NeMo 8cfedd720346) ---------------------------------------------------------------------------
def nemo_step(epoch, n, total, metrics: dict) -> str:
    """nemo/lightning/pytorch/callbacks/progress_printer.py format_string with the train prefix."""
    log_string = "Training" + f" epoch {epoch}, iteration {n - 1}/{total - 1}"
    for metric, val in metrics.items():
        if isinstance(val, (float)) and val.is_integer():
            val = int(val)
            log_string += f" | {metric}: {val}"
        else:
            log_string += f" | {metric}: {val:.4}"
    return log_string


def nemo_logger(t: float, module: str, lineno: int, message: str, level="I") -> str:
    """nemo/utils/formatters/base.py: ``"%(color)s[NeMo %(levelname)1.1s %(asctime)s %(module)s:%(lineno)d]%(end_color)s
    %(message)s"`` with datefmt ``"%Y-%m-%d %H:%M:%S"``."""
    return f"[NeMo {level} {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} {module}:{lineno}] {message}"


def nemo_save(rank, iteration, start, duration) -> str:
    """nemo/lightning/io/pl.py MegatronCheckpointIO.save_checkpoint log_parts joined with " : "."""
    parts = (
        "Global Checkpoint Save",
        f"Rank: {rank}",
        f"Iteration: {iteration}" if iteration is not None else None,
        f"Start time: {start:.3f}s",
        f"Save duration: {duration:.3f}s",
    )
    return " : ".join(p for p in parts if p is not None)


# -- DeepSpeed (deepspeedai/DeepSpeed edaa72212672) ---------------------------------------------------------------
def ds_logger(t: float, filename: str, lineno: int, func: str, message: str) -> str:
    """deepspeed/utils/logging.py: ``"[%(asctime)s] [%(levelname)s] " "[%(filename)s:%(lineno)d:%(funcName)s]
    %(message)s"``."""
    return f"[{asctime(t)}] [INFO] [{filename}:{lineno}:{func}] {message}"


def ds_throughput(epoch, micro, global_step, running, current, mem, maxmem) -> str:
    """deepspeed/utils/timer.py ThroughputTimer.stop."""
    return (
        "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, "
        "MemAllocated={}GB, MaxMemAllocated={}GB".format(epoch, micro, global_step, running, current, mem, maxmem)
    )


def ds_save(tag: str) -> str:
    """torch_checkpoint_engine.py create(): ``f"[Torch] Checkpoint {info.tag} is about to be saved!"`` via log_dist
    (``"[Rank {}] "`` prepended)."""
    return f"[Rank 0] [Torch] Checkpoint {tag} is about to be saved!"
