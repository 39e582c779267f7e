"""The mixture-of-experts feed-forward: a router sends each token to k of E SwiGLU experts.

    probs = softmax(x W_router)                      (N, E), over all experts
    top, experts = topk(probs, k)                    (N, k): each token's k experts
    weights = top / top.sum(-1)                      renormalised over the chosen k (Mixtral)
    y = sum_j weights[:, j] * expert_{experts[:, j]}(x)  (+ shared(x), DeepSeek's always-on experts)

The dispatch is dropless (MegaBlocks, Gale et al. 2022): the N k (token, expert) pairs are
sorted by expert, each expert runs one matmul on its contiguous rows, and the weighted rows
are added back into their tokens (minigrad's ``dispatch`` and ``combine``). No capacity
factor, so no token is dropped and none is padded.

Load balancing (Switch Transformer, Fedus et al. 2021, eq. 4; Mixtral): with f_e the share
of the N k assignments that went to expert e and P_e the mean router probability of e,

    aux = E * sum_e f_e * P_e

which is 1 when both are uniform. f is piecewise constant; the gradient flows through P and
pushes probability away from the experts that got more than their share. The model adds
``moe_aux_weight * aux`` of every layer to the training loss. (Hugging Face's Mixtral counts
f over tokens, so that its f sums to k and its loss is k times this one.)

DeepSeekMoE's n_shared always-on experts of width ``hidden`` are one SwiGLU of width
n_shared * hidden: the sum of SwiGLUs on the same input is a SwiGLU over their concatenated
hidden units. Left out on purpose: expert parallelism, capacity limits, router z-loss,
noisy top-k gating, DeepSeek's device-limited routing.
"""

from __future__ import annotations

import numpy as np

import minigrad as mg
from minigrad import functional as F
from minigrad.backend import to_numpy, xp_of
from minigrad.nn import Dropout, Linear, Module, ModuleList, SwiGLU
from minigrad.tensor import Tensor


class MoE(Module):
    """A routed feed-forward, (..., n_embd) -> (..., n_embd). After each forward it keeps
    ``aux_loss`` (a Tensor, the unweighted load-balancing loss above) and ``expert_share``
    (an (E,) array on the layer's device: each expert's share of the token-expert pairs).

    >>> moe = MoE(n_embd=8, n_experts=4, top_k=2, hidden=16)
    >>> moe(mg.randn(2, 3, 8)).shape, round(float(moe.expert_share.sum()), 6)
    ((2, 3, 8), 1.0)
    """

    def __init__(
        self,
        n_embd: int,
        n_experts: int,
        top_k: int,
        hidden: int,
        n_shared: int = 0,
        bias: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"MoE: top_k={top_k} must be in [1, n_experts={n_experts}]")
        self.top_k = top_k
        self.router = Linear(n_embd, n_experts, bias=False)
        # dropout once on the sum below, not inside each expert
        self.experts = ModuleList(SwiGLU(n_embd, hidden, bias) for _ in range(n_experts))
        self.shared = SwiGLU(n_embd, n_shared * hidden, bias) if n_shared else None
        self.dropout = Dropout(dropout)
        self.aux_loss: Tensor | None = None
        self.expert_share: np.ndarray | None = None

    def forward(self, x: Tensor) -> Tensor:
        *lead, C = x.shape
        E, k = len(self.experts), self.top_k
        flat = x.reshape(-1, C)  # (B, T, C) -> (N, C)
        N = flat.shape[0]
        probs = F.softmax(self.router(flat), axis=-1)  # (N, C) -> (N, E)
        top, chosen = probs.topk(k)  # (N, k) each: the values carry the gradient
        weights = top / top.sum(-1, keepdims=True)  # (N, k), each row sums to one
        # the N k pairs (token n, its j-th expert) in row-major order: pair i is token i // k
        xp = xp_of(chosen.data)
        expert_of = chosen.data.reshape(-1)  # (N, k) -> (N k,)
        order = xp.argsort(expert_of, kind="stable") if xp is np else xp.argsort(expert_of)
        token_of = order // k  # (N k,): the token of each pair, the pairs sorted by expert
        counts = xp.bincount(expert_of, minlength=E)  # (E,) pairs per expert
        # subtle: check=False: these rows are valid by construction, and checking them would
        # copy their range to the host
        xs = mg.dispatch(flat, token_of, check=False)  # (N, C) -> (N k, C), grouped by expert
        pieces, start = [], 0
        for expert, n in zip(self.experts, to_numpy(counts).tolist(), strict=True):
            if n:  # an expert that got no tokens does no work (and its weights get no gradient)
                pieces.append(expert(xs[start : start + n]))  # (n, C) -> (n, C)
                start += n
        ys = mg.concatenate(pieces) if pieces else xs  # (N k, C); xs is (0, C) if N is 0
        w = mg.dispatch(weights.reshape(-1, 1), order, check=False)  # (N, k) -> (N k, 1)
        out = mg.combine(ys * w, token_of, N, check=False)  # (N k, C) -> (N, C): k rows each
        if self.shared is not None:
            out = out + self.shared(flat)
        share = counts.astype(probs.dtype) / max(N * k, 1)  # (E,) f: zeros for an empty batch
        # subtle: P's mean over no tokens would be NaN; an empty batch has no imbalance to fix
        mean_probs = probs.mean(0) if N else probs.sum(0)  # (N, E) -> (E,)
        self.aux_loss = E * (mean_probs * Tensor(share)).sum()
        self.expert_share = share  # on the device: only the log reads it
        return self.dropout(out.reshape(*lead, C))

    def num_active_parameters(self) -> int:
        """Parameters one token uses: the router, k of the E routed experts, the shared ones.

        >>> MoE(n_embd=8, n_experts=4, top_k=1, hidden=16).num_active_parameters()
        416
        """
        inactive = len(self.experts) - self.top_k
        return self.num_parameters() - inactive * self.experts[0].num_parameters()
