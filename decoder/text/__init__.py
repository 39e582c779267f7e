"""Text: what goes into the model and what comes out of it.

In data-flow order: ``rust_regex`` (tiktoken's split patterns for Python's ``re``), ``bpe``
(byte-pair encoding trained here), ``tokenizer`` (char, BPE and tiktoken behind one
protocol), ``data`` (tiny Shakespeare, token ids, batches) and ``stream`` (a model's tokens
back into text as they come). Imports no other part of decoder.
"""
