"""minigrad.nn: Module and Parameter, the containers, the transformer's layers, and LoRA.

    from minigrad import nn
    mlp = nn.MLP(n_embd=128, hidden=512)
    y = mlp(x)                      # (B, T, 128) -> (B, T, 128)
    mlp.named_parameters()          # [("w1.weight", ...), ("w1.bias", ...), ...]

One concept per file: module.py (Module, Parameter, ModuleList, ModuleDict, Sequential),
layers.py (Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU, SiLU, and the GPT-2
initialisation INIT_STD and normal_parameter, which a model uses to re-initialise weights),
feedforward.py (MLP, SwiGLU) and lora.py (LoRALinear, LoRAHeadLinear, apply_lora and friends).
"""

from minigrad.nn.feedforward import MLP, SwiGLU
from minigrad.nn.layers import (
    GELU,
    INIT_STD,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    RMSNorm,
    SiLU,
    normal_parameter,
)
from minigrad.nn.lora import (
    LoRAHeadLinear,
    LoRALinear,
    apply_lora,
    load_lora_state_dict,
    lora_state_dict,
    merge_lora,
)
from minigrad.nn.module import LoadResult, Module, ModuleDict, ModuleList, Parameter, Sequential

__all__ = [
    "GELU",
    "INIT_STD",
    "MLP",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "Linear",
    "LoRAHeadLinear",
    "LoRALinear",
    "LoadResult",
    "Module",
    "ModuleDict",
    "ModuleList",
    "Parameter",
    "RMSNorm",
    "Sequential",
    "SiLU",
    "SwiGLU",
    "apply_lora",
    "load_lora_state_dict",
    "lora_state_dict",
    "merge_lora",
    "normal_parameter",
]
