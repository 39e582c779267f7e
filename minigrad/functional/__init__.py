"""minigrad.functional: the fused hot-path ops of a transformer, each one Function with a
hand-derived backward, plus the attention entry point.

One concept per file: softmax.py (softmax, log_softmax), loss.py (cross_entropy),
activations.py (gelu, silu), norms.py (layer_norm, rms_norm), dropout.py, linear.py
(linear, embedding), attention.py (scaled_dot_product_attention).
"""
