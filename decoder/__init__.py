"""decoder: a decoder-only transformer language model built on minigrad.

The pieces live in five rooms, in the order data flows through them:

- ``text``: ``tokenizer`` (char, ``bpe`` with ``rust_regex`` for tiktoken's split patterns,
  tiktoken), ``data`` (the corpus as token ids and batches) and ``stream`` (tokens back
  into text as they come);
- ``model``: ``config`` (ModelConfig), ``positional``, ``attention`` (and ``mla``, latent
  attention), ``moe``, ``block``, ``model`` (Decoder) and ``decoding`` (sampling, beam
  search, speculative decoding); it imports only minigrad;
- ``training``: ``config`` (TrainConfig and the presets), ``step`` (one optimiser step, one
  evaluation), ``shards`` (a step's rows on several cores, in worker processes),
  ``mixed_precision``, ``dist`` (data-parallel over MPI ranks), ``run``, ``loop`` and ``log``
  (a run, its loop, its log and plot), ``checkpoint`` and ``rundir`` (the locked output
  directory);
- ``post``: ``chat``, ``instruct_data``, ``posttrain``, ``sft`` and ``dpo`` for instruction
  tuning and preference optimisation, and ``lora`` (LoRA adapters on new text);
- ``hf``: Hugging Face's ``config`` (config.json), ``tokenizer`` (tokenizer.json) and
  ``pretrained`` (their checkpoints).

Arrows go one way: text and model stand alone, training uses both, post uses training (and
hf for a Hugging Face base), hf uses model and text. At the top sit the six commands,
``train``, ``generate``, ``finetune``, ``sft``, ``dpo`` and ``chat`` (``python -m
decoder.<command>``, each with its own --help), and ``cli``, what their command lines share;
``python -m decoder`` (``__main__``) lists them.
"""

from decoder.model.model import Decoder

__all__ = ["Decoder"]
