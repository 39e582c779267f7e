"""minigrad.functional: the fused hot-path ops of a transformer, each one Function with a
hand-derived backward, plus the attention entry point.

One concept per file: softmax.py (softmax, log_softmax), loss.py (cross_entropy),
activations.py (gelu, silu), norms.py (layer_norm, rms_norm), dropout.py, linear.py
(linear, embedding), attention.py (scaled_dot_product_attention). Their shared pieces:
rows.py (row sums and the shifted exponentials along the last axis), inputs.py (the index
and dtype checks) and erf.py (erf and erfc, for the exact GELU). Each op is written in its
plain form; fast.py holds the fast paths beside them (in-place GELU, BLAS row sums, a skipped
shift), which ``minigrad.set_fast_paths`` switches.
"""

from minigrad.functional.activations import gelu, silu
from minigrad.functional.attention import scaled_dot_product_attention
from minigrad.functional.dropout import dropout
from minigrad.functional.linear import embedding, linear
from minigrad.functional.loss import cross_entropy
from minigrad.functional.norms import layer_norm, rms_norm
from minigrad.functional.softmax import log_softmax, softmax

__all__ = [
    "cross_entropy",
    "dropout",
    "embedding",
    "gelu",
    "layer_norm",
    "linear",
    "log_softmax",
    "rms_norm",
    "scaled_dot_product_attention",
    "silu",
    "softmax",
]
