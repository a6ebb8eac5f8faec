"""A small decoder-only transformer language model: the language-modelling workload beside the CNNs.

Architecture (pre-LayerNorm blocks, tied head) and init after Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners" (GPT-2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalesgd import checks
from scalesgd.options import option

# The largest sizes taken, each GPT-3 175B's (Brown et al. 2020) or twice it: far past what a run here trains, and
# bounded so a typo is refused at once instead of filling memory or computing for minutes in silence.
MAX_LAYERS = 96
MAX_WIDTH = 12288
MAX_BLOCK = 4096


@dataclass(frozen=True)
class GptOptions:
    """The GPT's size: blocks, heads, width, context length and dropout."""

    layers: int = option(4, "GPT: transformer blocks", check=checks.within(
        1, MAX_LAYERS, note="GPT-3 175B's depth; each block's weights, gradients and optimizer state are held"))
    heads: int = option(4, "GPT: attention heads per block", check=checks.at_least(1))  # at most the width
    width: int = option(128, "GPT: embedding width, a multiple of the heads", check=checks.within(
        1, MAX_WIDTH, note="GPT-3 175B's width; a block's weights grow with its square"))
    block: int = option(64, "GPT: context length in tokens (the sequence length)", check=checks.within(
        1, MAX_BLOCK, note="tokens; attention's time and memory grow with its square: GPT-2 takes 1024, GPT-3 2048"))
    dropout: float = option(0.0, "GPT: dropout probability", check=checks.within(0, 1, high_open=True))

    def problem(self) -> str | None:
        """What is wrong across fields (width not divisible by heads), or None."""
        if self.width % self.heads:
            return f"GPT width {self.width} is not divisible by its {self.heads} heads"
        return None


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: one fused qkv projection, fused attention, an output projection."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """One pre-LayerNorm block: x + attn(ln1(x)), then x + mlp(ln2(x)) with a 4× GELU MLP."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
                                 nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, pre-LN blocks, a final LayerNorm and a head tied to the token embedding."""

    def __init__(self, vocab_size: int, options: GptOptions) -> None:
        super().__init__()
        o = options
        self.options, self.vocab_size = o, vocab_size
        self.tok, self.pos = nn.Embedding(vocab_size, o.width), nn.Embedding(o.block, o.width)
        self.drop = nn.Dropout(o.dropout)
        self.blocks = nn.ModuleList(Block(o.width, o.heads, o.dropout) for _ in range(o.layers))
        self.ln = nn.LayerNorm(o.width)
        self.head = nn.Linear(o.width, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for block in self.blocks:  # the residual projections: GPT-2's 1/√N, N = 2·layers residual additions
            for proj in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * o.layers))

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits (B, T, vocab) of int64 tokens (B, T), T at most the block size."""
        t = tokens.shape[1]
        if t > self.options.block:
            raise ValueError(f"sequence of {t} tokens is longer than the GPT's block size {self.options.block}")
        x = self.drop(self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def flops_per_token(self) -> float:
        """Forward FLOPs per token at full context (Kaplan et al. 2020): 2·N + 2·layers·block·width, N the
        parameters outside the token and position embeddings (blocks and final LayerNorm; the tied head's
        2·vocab·width is left out, as there)."""
        embedding = {id(self.tok.weight), id(self.pos.weight)}
        n = sum(p.numel() for p in self.parameters() if id(p) not in embedding)
        o = self.options
        return float(2 * n + 2 * o.layers * o.block * o.width)


def gpt(vocab_size: int, options: GptOptions | None = None) -> GPT:
    """A GPT over `vocab_size` tokens; ValueError for options whose width does not split into its heads."""
    options = options or GptOptions()
    problem = options.problem()
    if problem:
        raise ValueError(problem)
    return GPT(vocab_size, options)
