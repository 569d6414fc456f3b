"""The tiny GPT-2 shape every real job trains, and the facts a user would put under ``jobs.<name>`` for it."""

from __future__ import annotations

import time

import torch

VOCAB, LAYERS, WIDTH, HEADS, SEQ = 256, 2, 128, 4, 128


def gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(  # bos/eos unused: random tokens, no generation
        bos_token_id=0,
        eos_token_id=0,
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def tokens(count: int, seed: int = 1) -> torch.Tensor:
    """``count`` random sequences of SEQ tokens: synthetic, in memory."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (count, SEQ), generator=generator)


def non_embedding_params() -> int:
    """What the HF Trainer's FLOPs count multiplies (``num_parameters(exclude_embeddings=True)``)."""
    return gpt2().num_parameters(exclude_embeddings=True)


def matmul_params() -> int:
    """The weights a forward pass multiplies by: every 2-D weight but the embeddings' lookups, plus the tied LM
    head's (a matmul by the token embedding), what a FLOP counter sees."""
    model = gpt2()
    inner = sum(p.numel() for n, p in model.transformer.h.named_parameters() if p.dim() == 2)
    return inner + VOCAB * WIDTH


def cpu_peak_flops(size: int = 512, seconds: float = 1.0) -> float:
    """One thread's float32 matmul FLOP/s (2·n³ per product): the declared peak of a CPU device, measured once."""
    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(a, b)  # warm-up
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        for _ in range(4):
            torch.matmul(a, b)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best


if __name__ == "__main__":
    # What the tests declare for these jobs, measured and counted once: python -m tests.support.realjobs.model
    import json

    print(
        json.dumps(
            {
                "peak_flops": cpu_peak_flops(),
                "non_embedding_params": non_embedding_params(),
                "matmul_params": matmul_params(),
            }
        )
    )
