"""Multi-head latent attention: cache size per token against MHA and GQA, and the absorbed
form against the explicit one per generated token.

1. The KV cache's numbers per token of the whole model (``cache_floats_per_token``) for MHA,
   GQA and MLA versions of the same model, and the bytes at float32.
2. One MLA layer (n_embd 512, 8 heads, d_c 128, d_R 32, d_nope = d_v = 64, float32) generating
   one token over a cache already holding S = 1024 .. 8192 tokens (``--S``): process CPU time
   (best of ``--reps``) of the explicit form, which up-projects every cached latent to keys
   and values at every step (O(S d_c nh (d_nope + d_v))), and of the absorbed form, which
   attends over the latents themselves (O(S nh (d_c + d_R))). The cache is filled with random
   numbers: the time does not depend on them. The two outputs are compared too.

Run it on one BLAS thread (below): a multithreaded BLAS spins while waiting, and on a busy
machine that spinning lands in the CPU time of a few steps at random.
Usage: OPENBLAS_NUM_THREADS=1 python bench/mla.py [--S 1024 4096 8192] [--reps 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import minigrad as mg
from decoder.model.config import ModelConfig
from decoder.model.mla import MultiHeadLatentAttention, cache_floats_per_token
from minigrad.autograd import no_grad

MODEL = dict(n_layer=8, n_head=8, n_embd=512, pos="rope")  # head size 64
LATENT = dict(kv_lora_rank=128, rope_head_dim=32)


def cache_table() -> None:
    rows = {
        "MHA (8 kv heads)": ModelConfig(**MODEL),
        "GQA (2 kv heads)": ModelConfig(**MODEL, n_kv_head=2),
        "MLA (d_c 128, d_R 32)": ModelConfig(**MODEL, attention="mla", **LATENT),
    }
    print(f"KV cache per token, {MODEL['n_layer']} layers, n_embd {MODEL['n_embd']}, 8 heads")
    print(f"{'attention':<22} {'floats':>7} {'KiB f32':>8} {'vs MHA':>7}")
    mha = cache_floats_per_token(rows["MHA (8 kv heads)"])
    for name, cfg in rows.items():
        floats = cache_floats_per_token(cfg)
        print(f"{name:<22} {floats:>7} {4 * floats / 1024:>8.1f} {floats / mha:>7.3f}")


@no_grad()
def step_times(S: int, reps: int) -> tuple[float, float, float]:
    """Best CPU seconds per token of the explicit and absorbed forms, and their largest
    difference, for one token after S cached ones."""
    mg.manual_seed(0)
    mla = MultiHeadLatentAttention(
        MODEL["n_embd"], MODEL["n_head"], **LATENT, nope_head_dim=64, v_head_dim=64,
        block_size=S + 1,
    ).eval()  # fmt: skip
    rng = np.random.default_rng(0)
    x = mg.tensor(rng.standard_normal((1, 1, MODEL["n_embd"])).astype(np.float32))
    cache = mla.new_cache(1)
    cache.k[:, :, :S] = rng.standard_normal(cache.k[:, :, :S].shape)
    cache.v[:, :, :S] = rng.standard_normal(cache.v[:, :, :S].shape)
    best, outs = {}, {}
    for absorb in (False, True):
        times = []
        for _ in range(reps):
            cache.length = S  # forget the token the last step appended
            start = time.process_time()
            outs[absorb] = mla(x, cache, absorb=absorb).numpy()
            times.append(time.process_time() - start)
        best[absorb] = min(times)
    return best[False], best[True], float(np.abs(outs[False] - outs[True]).max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--S", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    cache_table()
    print("\none MLA layer, one new token over S cached ones (CPU ms per token, float32)")
    print(f"{'S':>6} {'explicit':>9} {'absorbed':>9} {'speed-up':>9} {'max |diff|':>11}")
    for S in args.S:
        explicit, absorbed, diff = step_times(S, args.reps)
        print(
            f"{S:>6} {1e3 * explicit:>9.2f} {1e3 * absorbed:>9.2f} "
            f"{explicit / absorbed:>8.1f}x {diff:>11.1e}"
        )


if __name__ == "__main__":
    main()
