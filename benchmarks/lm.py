"""The language model of the low-communication benchmark (DiLoCo's setting, scaled to this machine): a small
decoder-only transformer trained with AdamW on Python's own documentation.

- Data: the pydoc topics that ship with every CPython (pydoc_data.topics), tokenized as gravac_models.py's NPLM
  tokenizes them (lowercased words, numbers and single punctuation marks; the 1,999 most frequent tokens and
  <unk>), cut into non-overlapping sequences of `context` + 1 tokens: x the first `context`, y the same shifted by
  one. The last 10% of the text is the test set. Nothing is downloaded.
- Model: token and learned position embeddings (width 128, drawn N(0, 0.02^2)), `layers` pre-norm transformer blocks (4
  heads, causal self-attention, a GELU MLP of 4 x 128), a final LayerNorm and an output layer tied to the token
  embedding. Loss: mean cross-entropy over every position; its exponential is the perplexity the benchmark reports.
- Inner optimizer: AdamW as DiLoCo and OpenDiLoCo use it (betas 0.9, 0.95; weight decay 0.1), learning rate
  `INNER_LR` after a linear warm-up of `WARMUP` steps.
"""
import collections
import math
import re

import torch
import torch.nn.functional as F

INNER_LR, WARMUP = 1e-3, 50


def pydoc_sequences(vocab=2000, context=32, test_share=0.1):
    """(x_train, y_train, x_test, y_test): int64 [sequences, context] next-token pairs from pydoc_data.topics."""
    from pydoc_data.topics import topics
    text = "\n".join(topics[key] for key in sorted(topics)).lower()
    tokens = re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", text)
    ids = {tok: i for i, (tok, _) in enumerate(collections.Counter(tokens).most_common(vocab - 1))}
    stream = torch.tensor([ids.get(tok, vocab - 1) for tok in tokens], dtype=torch.long)
    split = int(len(stream) * (1 - test_share))

    def cut(part):
        windows = part.unfold(0, context + 1, context)  # non-overlapping: each token predicted once
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    return (*cut(stream[:split]), *cut(stream[split:]))


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TransformerLM(torch.nn.Module):
    def __init__(self, vocab=2000, context=32, width=128, heads=4, layers=2):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        for embedding in (self.tokens, self.positions):  # GPT-2's scale: logits near 0, loss near ln(vocab) at start
            torch.nn.init.normal_(embedding.weight, std=0.02)
        self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1),
                             persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.tokens(x) + self.positions(torch.arange(t, device=x.device))
        for block in self.blocks:
            h = block(h, self.mask[:t, :t])
        return self.norm(h) @ self.tokens.weight.t()  # tied output layer


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def evaluate(model, x, y, batch=256):
    """(mean cross-entropy, next-token accuracy) over every position of (x, y)."""
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = model(x[i:i + batch])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + batch].reshape(-1),
                                     reduction="sum").item()
            correct += (logits.argmax(-1) == y[i:i + batch]).sum().item()
            count += y[i:i + batch].numel()
    return total / count, correct / count


def inner_optimizer(model, lr=INNER_LR, warmup=WARMUP):
    """(AdamW, its scheduler): DiLoCo's inner optimizer, linear warm-up to lr over `warmup` steps, then constant."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup))
    return opt, schedule


def build(seed=42, context=32, layers=2):
    """(model, (x_train, y_train, x_test, y_test)) built the same way on every rank."""
    torch.manual_seed(seed)
    return TransformerLM(context=context, layers=layers), pydoc_sequences(context=context)


def perplexity(loss):
    return math.exp(loss)
