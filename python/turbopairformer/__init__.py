"""TurboPairFormer: fast, accurate, bitwise-deterministic Pairformer kernels for NVIDIA Hopper.

import turbopairformer as tpf
out = tpf.triangle_attention(q, k, v, bias, mask)          # cuEquivariance-compatible
layer = tpf.TriangleAttention(c_in=128, c_hidden=32, no_heads=4)  # OpenFold3 weights load
"""

from ._native import LIBRARY_PATH, version
from .attention import triangle_attention
from .modules import (
    TriangleAttention,
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
    TriangleMultiplicativeUpdate,
    TriangleMultiplicativeUpdateIncoming,
)
from .pairformer import (
    AttentionPairBias,
    PairBlock,
    PairformerBlock,
    PairformerStack,
    SwiGLUTransition,
)
from .trimul import triangle_multiplicative_update

__version__ = "0.1.0"
__all__ = [
    "triangle_attention",
    "triangle_multiplicative_update",
    "TriangleAttention",
    "TriangleAttentionStartingNode",
    "TriangleAttentionEndingNode",
    "TriangleMultiplicativeUpdate",
    "TriangleMultiplicativeUpdateIncoming",
    "PairformerBlock",
    "PairformerStack",
    "PairBlock",
    "AttentionPairBias",
    "SwiGLUTransition",
    "version",
    "LIBRARY_PATH",
]
