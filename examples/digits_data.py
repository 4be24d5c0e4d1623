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


def add_training_arguments(parser):
    """The examples' shared arguments: epochs, batch size, learning rate, momentum, width, data, seed, --json."""
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--data", choices=["digits", "synthetic"], default="digits",
                        help="digits (scikit-learn's 8x8 images) or synthetic (Gaussian inputs labelled by a random "
                             "linear teacher), whose model has --model-size parameters")
    parser.add_argument("--model-size", type=float, default=1e6, help="parameters of the synthetic run's MLP")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", default=None, help="rank 0 writes the results here")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="train on the CPU where a GPU is")


def training_data(args, local_rank):
    """(x_train, y_train, x_test, y_test) of args.data, on this rank's GPU where one is and --no-cuda is not given
    (one GPU per local rank, as in Horovod's examples; ranks share a GPU where there are fewer). Sets args.cuda, and
    for synthetic data args.hidden (for --model-size)."""
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    if args.data == "synthetic":
        args.hidden = hidden_for(args.model_size)
        data = synthetic_data(args.seed)
    else:
        data = load_data(args.seed)
    if not args.cuda:
        return data
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return tuple(t.cuda() for t in data)
