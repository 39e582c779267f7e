"""A floor under the memory a model and its training batches need, known before anything is
allocated: a size typed with a few zeros too many (``--batch_size=10000000000``, a
config.json claiming 2**31 positions) is refused in one line naming the setting to lower,
instead of a NumPy traceback, or the operating system killing the process minutes later.

The floor counts only what every configuration allocates, so it lies below the true need: a
refusal is never wrong, and a run that passes may still run out (the commands then catch
MemoryError: decoder.cli.run_command). Left out on purpose: an exact estimate (the
feed-forward's and experts' weights, attention's T x T scores, the allocator's slack).
"""

from __future__ import annotations

import os

from decoder.model.config import ModelConfig

GIB = 2**30
# what each term of memory_floor holds, as the message names it
HOLDS = {
    "n_embd": "the weights",
    "block_size": "the position tables",
    "batch_size": "a batch's activations",
}


def memory_floor(
    config: ModelConfig, itemsize: int, batch_size: int = 0, training: bool = False
) -> dict[str, int]:
    """Bytes certainly allocated, by the setting that drives them: ``n_embd`` the weights
    (with their gradients and AdamW's two moments when ``training``), ``block_size`` the
    position tables, ``batch_size`` what a training step keeps for its backward: in each
    block its input, the two norms' outputs and the attention's output; the logits and their
    gradient.

    >>> config = ModelConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=4)
    >>> memory_floor(config, itemsize=4, batch_size=3, training=True)
    {'n_embd': 1664, 'block_size': 128, 'batch_size': 4992}
    """
    C, T = config.n_embd, config.block_size
    weights = config.vocab_size * C  # tok_emb
    if config.attention == "mha":
        weights += config.n_layer * 2 * C * C  # each layer's wq and wo
    rope_width = config.rope_head_dim if config.attention == "mla" else config.head_size
    tables = {"learned": T * C, "sinusoidal": T * C, "rope": 2 * T * rope_width}  # cos and sin
    return {
        "n_embd": weights * itemsize * (4 if training else 1),
        "block_size": tables.get(config.pos, 0) * 4,  # float32 tables
        "batch_size": batch_size * T * (4 * C * config.n_layer + 2 * config.vocab_size) * itemsize,
    }


def check_memory(floor: dict[str, int], device: str, fixes: dict[str, str]) -> None:
    """Raise ValueError when ``floor`` (memory_floor's) exceeds the memory of ``device``,
    saying what the largest part holds and ``fixes[its setting]``; unknown memory passes.

    >>> check_memory({"n_embd": 2**70, "block_size": 0}, "cpu", {"n_embd": "lower --n_embd"})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: this needs at least 1099511627776.0 GiB of memory (the weights ...: lower --n_embd
    """
    have, total = device_memory(device), sum(floor.values())
    if have is None or total <= have:
        return
    largest = max(floor, key=floor.__getitem__)
    parts = ", ".join(f"{HOLDS[k]} {v / GIB:.1f} GiB" for k, v in floor.items() if v > GIB / 10)
    where = "this machine" if device == "cpu" else f"the {device} device"
    raise ValueError(
        f"this needs at least {total / GIB:.1f} GiB of memory ({parts}), more than the "
        f"{have / GIB:.1f} GiB {where} has: {fixes[largest]}"
    )


def device_memory(device: str) -> int | None:
    """Bytes of memory on ``device`` (the machine's RAM for the CPU), or None if unknown."""
    if device == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
            return None
    try:
        from minigrad.backend import get_xp

        return int(get_xp(device).cuda.runtime.memGetInfo()[1])
    except (ImportError, AttributeError, RuntimeError):
        return None
