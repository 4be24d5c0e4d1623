"""The digits examples' PyTorch data and model (examples/pytorch_digits.py over Horovod, examples/ddp_digits.py
over DDP): scikit-learn's 8x8 digits, or Gaussian inputs labelled by a random linear teacher, and a three-layer
MLP."""
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def load_data(seed):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=seed,
                                                        stratify=digits.target)
    as_t = torch.from_numpy
    return as_t(x_train), as_t(y_train).long(), as_t(x_test), as_t(y_test).long()


def synthetic_data(seed, features=64, samples=4096, classes=10):
    """Gaussian inputs labelled by a random linear teacher: learnable, and as large as asked."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    y = (x @ torch.randn(features, classes, generator=gen)).argmax(1)
    split = samples * 3 // 4
    return x[:split], y[:split], x[split:], y[split:]


def hidden_for(parameters, features=64):
    """The width h of make_model whose 64*h + h*h/2 + ... weights come to about `parameters`."""
    return max(16, int(-features + (features ** 2 + 2 * parameters) ** 0.5))


def make_model(hidden):
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden // 2),
                               torch.nn.ReLU(), torch.nn.Linear(hidden // 2, 10))
