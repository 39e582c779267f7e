"""decoder: a decoder-only transformer language model built on minigrad.

The pieces live in their own modules, in the order data flows through them:

- the model: ``config`` (ModelConfig, TrainConfig, presets), ``tokenizer`` (with
  ``rust_regex`` for tiktoken's split patterns and ``hf_tokenizer`` for Hugging Face's
  files), ``data``, ``positional``, ``attention`` (and ``mla``, latent attention), ``moe``,
  ``block`` and ``model`` (Decoder);
- training: ``step`` (one optimiser step, one evaluation), ``shards`` (a step's rows on
  several cores, in worker processes), ``train``, ``checkpoint``, ``rundir`` (the locked
  output directory), ``mixed_precision`` and ``dist`` (data-parallel over MPI ranks);
- using a model: ``generate`` and ``decoding`` (beam search, speculative decoding),
  ``pretrained`` (Hugging Face checkpoints);
- adapting it: ``finetune`` (LoRA), and ``chat``, ``instruct_data``, ``posttrain``, ``sft``
  and ``dpo`` for instruction tuning and preference optimisation.

``python -m decoder`` (``__main__``) lists the commands.
"""
