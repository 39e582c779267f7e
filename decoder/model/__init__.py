"""The model: token ids in, next-token logits out, and the choice of the next token.

In data-flow order: ``config`` (ModelConfig, the shape), ``positional`` (learned, sinusoidal,
RoPE, ALiBi), ``attention`` (causal self-attention and its KV cache; ``mla``, latent
attention), ``moe`` (a mixture of experts), ``block`` (one transformer block), ``model``
(Decoder) and ``decoding`` (sampling, beam search, speculative decoding).
Imports only minigrad: nothing here knows about text, training or files.
"""
