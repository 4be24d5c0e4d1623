"""The three models of different shape GraVAC's defaults are chosen and checked on (issue 14), each with its data
(bundled or synthetic, nothing downloaded), built the same way on every rank:

- "mlp": the digits MLP of examples/pytorch_digits.py (64-256-128-10, 50,826 parameters at its default width);
- "cnn": a small CNN on the same 8x8 digits (two 3x3 convolutions, 38,282 parameters);
- "lstm": a one-layer LSTM language model on sequences drawn from a fixed random order-2 Markov chain over 16
  tokens (next-token accuracy; the chain's own best guess bounds it), 25,616 parameters.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from pytorch_digits import load_data, make_model  # noqa: E402

MODELS = ("mlp", "cnn", "lstm")
LEARNING_RATES = {"mlp": 0.05, "cnn": 0.05, "lstm": 0.5}


class DigitsCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.hidden = torch.nn.Linear(32 * 4 * 4, 64)
        self.out = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x.view(-1, 1, 8, 8)))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.out(F.relu(self.hidden(x.flatten(1))))


class MarkovLSTM(torch.nn.Module):
    def __init__(self, vocab=16, embed=16, hidden=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embed)
        self.lstm = torch.nn.LSTM(embed, hidden, batch_first=True)
        self.out = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.lstm(self.embed(x))[0])


def markov_data(seed=42, vocab=16, length=33, train=2048, test=512):
    """Sequences of a random order-2 Markov chain whose transitions are peaked (Dirichlet 0.2): inputs are the
    first 32 tokens, targets the next 32."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.distributions.Dirichlet(torch.full((vocab,), 0.2)).sample((vocab, vocab))
    seqs = torch.empty(train + test, length, dtype=torch.long)
    seqs[:, :2] = torch.randint(vocab, (train + test, 2), generator=gen)
    for t in range(2, length):
        seqs[:, t] = torch.multinomial(probs[seqs[:, t - 2], seqs[:, t - 1]], 1, generator=gen).squeeze(1)
    x, y = seqs[:, :-1], seqs[:, 1:]
    return x[:train], y[:train], x[train:], y[train:]


def build(name, seed=42, hidden=256):
    """(model, (x_train, y_train, x_test, y_test), loss_fn, accuracy_fn, lr) of a model named in MODELS; lr is the
    SGD (momentum 0.9) learning rate it trains well with at batch 32 per rank."""
    torch.manual_seed(seed)
    if name == "lstm":
        data, model = markov_data(seed), MarkovLSTM()

    else:
        data, model = load_data(seed), make_model(hidden) if name == "mlp" else DigitsCNN()

    def loss_fn(out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def accuracy(model, x, y):
        with torch.no_grad():
            return (model(x).argmax(-1) == y).float().mean().item()
    return model, data, loss_fn, accuracy, LEARNING_RATES[name]
