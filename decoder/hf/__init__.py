"""Hugging Face: models and tokenizers in Hugging Face's formats.

In data-flow order: ``config`` (``config.json`` <-> ModelConfig), ``tokenizer``
(``tokenizer.json``, read without the ``tokenizers`` library) and ``pretrained`` (load a model
directory or hub name into a Decoder, and save one back). Uses decoder.model and decoder.text.
"""
