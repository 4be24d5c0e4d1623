"""The models of different shape GraVAC's defaults are chosen and checked on, each with its data (bundled with
Python or a package, or synthetic; nothing downloaded), built the same way on every rank:

- "mlp": the digits MLP of examples/pytorch_digits.py (64-256-128-10, 50,826 parameters at its default width);
- "cnn": a small CNN on the same 8x8 digits (two 3x3 convolutions, 38,282 parameters);
- "lstm": a one-layer LSTM language model on sequences drawn from a fixed random order-2 Markov chain over 16
  tokens (next-token accuracy; the chain's own best guess bounds it), 25,616 parameters;
- "nplm": a word-level neural probabilistic language model (Bengio et al. 2003: the embeddings of the 4 previous
  tokens, concatenated, a tanh layer of 448, a softmax over the vocabulary) on Python's own documentation, the
  pydoc topics that ship with every CPython (pydoc_data.topics: 120k tokens of English prose and code; the 1,999
  most frequent tokens and <unk>, covering 98.5% of the text); the last 10% of the text is the test set
  (next-token accuracy), 1,141,136 parameters.
"""
import collections
import os
import re
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from digits_data import load_data, make_model  # noqa: E402

MODELS = ("mlp", "cnn", "lstm", "nplm")
LEARNING_RATES = {"mlp": 0.05, "cnn": 0.05, "lstm": 0.5, "nplm": 0.1}


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


class NPLM(torch.nn.Module):
    def __init__(self, vocab=2000, context=4, embed=64, hidden=448):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embed)
        self.hidden = torch.nn.Linear(context * embed, hidden)
        self.out = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(self.embed(x).flatten(1))))


def pydoc_data_tokens(vocab=2000, context=4, test_share=0.1):
    """(x_train, y_train, x_test, y_test) of next-token prediction on pydoc_data.topics: lowercased words, numbers
    and single punctuation marks; tokens outside the vocab-1 most frequent are <unk> (id vocab-1); x holds the
    `context` previous token ids, y the next. The test set is the last test_share of the text."""
    from pydoc_data.topics import topics
    text = "\n".join(topics[key] for key in sorted(topics)).lower()
    tokens = re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", text)
    ids = {tok: i for i, (tok, _) in enumerate(collections.Counter(tokens).most_common(vocab - 1))}
    stream = torch.tensor([ids.get(tok, vocab - 1) for tok in tokens], dtype=torch.long)
    windows = stream.unfold(0, context + 1, 1)
    x, y = windows[:, :context].contiguous(), windows[:, context].contiguous()
    split = int(len(x) * (1 - test_share))
    return x[:split], y[:split], x[split + context:], y[split + context:]


def build(name, seed=42, hidden=256):
    """(model, (x_train, y_train, x_test, y_test), loss_fn, accuracy_fn, lr) of a model named in MODELS; lr is the
    SGD (momentum 0.9) learning rate it trains well with at batch 32 per rank."""
    torch.manual_seed(seed)
    if name == "lstm":
        data, model = markov_data(seed), MarkovLSTM()
    elif name == "nplm":
        data, model = pydoc_data_tokens(), NPLM()

    else:
        data, model = load_data(seed), make_model(hidden) if name == "mlp" else DigitsCNN()

    def loss_fn(out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def accuracy(model, x, y):
        with torch.no_grad():
            return (model(x).argmax(-1) == y).float().mean().item()
    return model, data, loss_fn, accuracy, LEARNING_RATES[name]
