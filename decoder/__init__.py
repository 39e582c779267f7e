"""decoder: a decoder-only transformer language model built on minigrad.

The pieces live in their own modules, in the order data flows through them: ``config``
(ModelConfig, TrainConfig, presets), ``tokenizer``, ``data``, ``positional``, ``attention``,
``block``, ``model`` (Decoder), ``train``, ``checkpoint``, ``generate`` and ``finetune``.
"""
