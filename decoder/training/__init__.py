"""Training: turning text and a ModelConfig into trained weights on disk.

In data-flow order: ``config`` (TrainConfig and the presets), ``step`` (one optimiser step,
one evaluation) with ``shards`` (a step's rows on several cores), ``mixed_precision``
(float16 with a loss scale) and ``dist`` (data-parallel over MPI ranks); ``run`` (a run's
state, start and resume), ``loop`` (the loop every trainer runs), ``log`` (log.jsonl,
loss.png, the progress bar), ``checkpoint`` and ``rundir`` (the locked run directory).
Uses decoder.model and decoder.text.
"""
