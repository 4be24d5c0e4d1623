"""Run an unmodified Horovod training script with horovod-ext's compression.

    horovodrun -np 4 python -m horovod_ext.run --compression ternary train.py --epochs 5
    horovodrun -np 4 python -m horovod_ext.run --compression topk --compression-arg ratio=0.001 train.py
    horovodrun -np 4 python -m horovod_ext.run --optimizer diloco --optimizer-arg inner_steps=50 \
        --compression ternary --compression-arg error_feedback=True train.py

Before the script runs, Horovod's ``horovod.torch.DistributedOptimizer``, ``horovod.tensorflow.DistributedGradientTape``
and ``horovod.tensorflow.keras.DistributedOptimizer`` (and its Keras callbacks, which target Keras 2) are made to
resolve to horovod-ext's, with the launcher's
compression in place of the script's own ``compression=`` (every other argument is kept, bound by Horovod's own
signature). Both ``import horovod.torch as hvd`` and ``from horovod.torch import DistributedOptimizer`` see them: the
modules are patched as they are imported, so no framework is imported that the script does not import itself.
At exit rank 0 prints one line: bytes sent, their dense-equivalent, the ratio and the seconds spent communicating
(PyTorch; TensorFlow runs a step as one graph, where communication is not timed apart from compute).
A bad flag value exits with an error listing the allowed values on every rank, before the script starts.

Under ``torchrun`` a script's ``torch.nn.parallel.DistributedDataParallel`` models get the launcher's compression
as horovod_ext.ddp's communication hook (``torchrun --nproc_per_node 2 -m horovod_ext.run --compression ternary
train.py``); no Horovod is needed there.

``--optimizer diloco`` makes the script's ``hvd.DistributedOptimizer(optimizer, ...)`` (PyTorch's or Keras's)
a ``DiLoCoOptimizer`` around the same optimizer (its inner one), with the launcher's compression for the
pseudo-gradients and ``--optimizer-arg`` for its arguments (inner_steps, outer_lr, outer_momentum, nesterov, groups, and
Streaming DiLoCo's fragments, overlap, merge_alpha); a TensorFlow script's DistributedGradientTape has no optimizer to
wrap and is refused.
"""
import argparse
import ast
import atexit
import importlib.abc
import importlib.util
import inspect
import os
import runpy
import sys

from horovod_ext.compression.registry import payload_compressors

LINEAR = ("none", "fp16")
OPTIMIZERS = ("data_parallel", "diloco")
CHOICES = LINEAR + tuple(payload_compressors())
SUMMARY_PREFIX = "horovod_ext.run:"


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: packing=base3, policy=linear


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m horovod_ext.run",
        description="Run an unmodified Horovod script with horovod-ext compression (under horovodrun).")
    parser.add_argument("--compression", default="none", choices=CHOICES,
                        help="the compressor every Horovod DistributedOptimizer / DistributedGradientTape of the "
                             "script uses (with --optimizer diloco: the pseudo-gradients')")
    parser.add_argument("--compression-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="an argument of the compressor, e.g. ratio=0.001 or shared_scale=True (repeatable)")
    parser.add_argument("--optimizer", default="data_parallel", choices=OPTIMIZERS,
                        help="data_parallel: Horovod's DistributedOptimizer with the compression; diloco: "
                             "DiLoCoOptimizer around the script's optimizer (PyTorch, Keras)")
    parser.add_argument("--optimizer-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="an argument of the optimizer, e.g. inner_steps=50 (repeatable)")
    parser.add_argument("--bucket-cap-mb", type=_literal, default=None, metavar="MB",
                        help="megabytes of gradient per bucket, whose per-tensor collectives go as one "
                             "(DistributedOptimizer's bucket_cap_mb; default 25; 0: one collective per tensor)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    try:
        args.spec = build_compression(args.compression, name_values(args.compression_arg, "--compression-arg"))
        args.optimizer_kwargs = build_optimizer(args.optimizer,
                                                name_values(args.optimizer_arg, "--optimizer-arg"))
        if args.bucket_cap_mb is not None:
            from horovod_ext.compression.buckets import check_bucket_cap_mb

            check_bucket_cap_mb(args.bucket_cap_mb, where="--bucket-cap-mb")
            if args.optimizer != "data_parallel":
                raise ValueError("--bucket-cap-mb is an argument of DistributedOptimizer (--optimizer "
                                 "data_parallel); DiLoCo sends its pseudo-gradients in one exchange")
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if not os.path.isfile(args.script):
        parser.error(f"script {args.script!r} does not exist")
    return args


def name_values(items, flag):
    """NAME=VALUE items as a dict of Python literals (bare words as strings)."""
    kwargs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{flag} must be NAME=VALUE, got {item!r}")
        kwargs[name.strip()] = _literal(value.strip())
    return kwargs


def build_optimizer(name, kwargs):
    """The optimizer's arguments, checked now (data_parallel takes none)."""
    if name == "data_parallel":
        if kwargs:
            raise ValueError(f"--optimizer data_parallel takes no --optimizer-arg (got {sorted(kwargs)})")
        return {}
    from horovod_ext.consensus.diloco import DEFAULTS, check_arguments

    unknown = sorted(set(kwargs) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"--optimizer-arg {unknown[0]!r} is not an argument of diloco; allowed: "
                         f"{', '.join(DEFAULTS)}")
    check_arguments(**{k: v for k, v in kwargs.items() if k != "groups"})  # groups: checked against the job's size
    if kwargs.get("outer") == "leader":
        raise ValueError("--optimizer-arg outer='leader' elects the worker with the lowest training loss, which an "
                         "unmodified script does not hand over; allowed here: outer='average' (pass "
                         "outer='leader' to DiLoCoOptimizer in the script, with optimizer.report_loss(loss))")
    return kwargs


def build_compression(name, kwargs):
    """The compressor spec for a payload compressor (checked now), or the name of a linear one."""
    if name in LINEAR:
        if kwargs:
            raise ValueError(f"--compression {name} takes no --compression-arg (got {sorted(kwargs)})")
        return name
    spec = payload_compressors()[name]
    allowed = [p for p in inspect.signature(type(spec).__init__).parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"--compression-arg {unknown[0]!r} is not an argument of {name}; allowed: "
                         f"{', '.join(allowed)}")
    return spec(**kwargs) if kwargs else spec


class Registry:
    """What the script created, for the summary at exit: (rank, object with compression_stats())."""

    def __init__(self, compression):
        self.compression = compression
        self.items = []

    def add(self, rank, obj, timed=True):
        if not hasattr(obj, "compression_stats"):  # Horovod's own Adasum optimizer: nothing of ours to report
            return
        if not self.items:
            # registered after hvd.init(), so it runs before Horovod's own atexit shutdown (atexit is LIFO)
            atexit.register(self.print_summary)
        if all(o is not obj for _, o, _ in self.items):
            self.items.append((rank, obj, timed))

    def summary(self):
        if not self.items or self.items[0][0] != 0:  # rank 0 prints
            return None
        sent = dense = comm = kernels = 0.0
        steps = 0
        timed = all(t for _, _, t in self.items)
        for _, obj, _ in self.items:
            stats = obj.compression_stats()
            total = stats["total"]
            sent += total["payload_bytes"]
            dense += total["dense_bytes"]
            comm += total["comm_seconds"]
            kernels += total["compress_seconds"] + total["decompress_seconds"]
            steps = max(steps, stats["steps"])
        ratio = dense / sent if sent else float("inf")
        comm_text = f"{comm:.3f} s" if timed else "not timed (TensorFlow runs the step as one graph)"
        line = (f"{SUMMARY_PREFIX} compression={self.compression} sent {sent / 1e6:.3f} MB, dense-equivalent "
                f"{dense / 1e6:.3f} MB, ratio {ratio:.1f}x, communication {comm_text} ({steps} steps, rank 0)")
        first = self.items[0][1].compression_stats()
        if timed and steps and first.get("step_seconds") is not None:
            # per step: the median step, its compute (step less compression and waiting) and the mean compression
            line += (f"; per step {1e3 * first['step_seconds']:.2f} ms, compute {1e3 * first['compute_seconds']:.2f}"
                     f" ms, compression {1e3 * kernels / steps:.3f} ms, communication {1e3 * comm / steps:.2f} ms")
        if first.get("choice"):
            counts = {}
            for entry in first["choice"].values():
                counts[entry["method"]] = counts.get(entry["method"], 0) + 1
            line += "; auto chose " + ", ".join(f"{method} for {n} tensors" for method, n in sorted(counts.items()))
        return line

    def print_summary(self):
        line = self.summary()
        if line:
            print(line, flush=True)


def _bind(original, args, kwargs):
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def diloco_of(ext, arguments, original, optimizer_kwargs):
    """The script's DistributedOptimizer(...) as a DiLoCoOptimizer around its optimizer; Horovod's arguments that
    DiLoCo has no meaning for must be left at their defaults."""
    defaults = {name: p.default for name, p in inspect.signature(original).parameters.items()}
    for name in ("backward_passes_per_step", "op", "gradient_predivide_factor", "num_groups", "groups",
                 "sparse_as_dense", "process_set"):
        if name in arguments and arguments[name] is not defaults.get(name) and arguments[name] != defaults.get(name):
            raise ValueError(f"--optimizer diloco: the script's DistributedOptimizer passes {name}="
                             f"{arguments[name]!r}, which DiLoCoOptimizer does not take; leave it at its default")
    return ext.DiLoCoOptimizer(arguments["optimizer"], arguments.get("named_parameters"),
                               compression=arguments["compression"], **optimizer_kwargs)


def torch_patch(module, choice, registry, kind="data_parallel", optimizer_kwargs=None, bucket_cap_mb=None):
    original = module.DistributedOptimizer

    def DistributedOptimizer(*args, **kwargs):
        import horovod_ext.torch as ext

        arguments = _bind(original, args, kwargs)
        arguments["compression"] = choice if not isinstance(choice, str) else getattr(ext.Compression, choice)
        if kind == "diloco":
            diloco = diloco_of(ext, arguments, original, optimizer_kwargs or {})
            registry.add(ext.rank(), diloco)
            return diloco
        if bucket_cap_mb is not None:
            arguments["bucket_cap_mb"] = bucket_cap_mb
        optimizer = ext.DistributedOptimizer(**arguments)
        registry.add(ext.rank(), optimizer)
        return optimizer

    DistributedOptimizer.__doc__ = original.__doc__
    # Horovod's broadcast_optimizer_state compares an optimizer's module with this function's
    DistributedOptimizer.__module__ = original.__module__
    module.DistributedOptimizer = DistributedOptimizer
    if "horovod.torch.optimizer" in sys.modules:
        sys.modules["horovod.torch.optimizer"].DistributedOptimizer = DistributedOptimizer
    # hvd.join() is horovod_ext.torch.join: the optimizers first take in what their last step left in flight
    import horovod_ext.torch as ext_torch

    module.join = ext_torch.join
    # the resume pattern's broadcast_optimizer_state also carries horovod-ext's compressor state
    from horovod_ext.torch.functions import broadcast_optimizer_state

    module.broadcast_optimizer_state = broadcast_optimizer_state
    # elastic scripts: hvd.elastic.TorchState and hvd.elastic.run handle horovod_ext's optimizer
    from horovod_ext.torch import elastic

    for name in ("TorchState", "run"):
        setattr(module.elastic, name, getattr(elastic, name))


def refuse_diloco(kind, what):
    if kind == "diloco":
        raise ValueError(f"--optimizer diloco wraps an optimizer (PyTorch's or Keras's DistributedOptimizer); this "
                         f"script makes a TensorFlow {what}, which has no optimizer to wrap (use --optimizer "
                         f"data_parallel)")


def tensorflow_patch(module, choice, registry, kind="data_parallel", bucket_cap_mb=None):
    original = module.DistributedGradientTape

    def DistributedGradientTape(*args, **kwargs):
        import horovod_ext.tensorflow as ext

        refuse_diloco(kind, "DistributedGradientTape")
        arguments = _bind(original, args, kwargs)
        arguments["compression"] = choice if not isinstance(choice, str) else getattr(ext.Compression, choice)
        if bucket_cap_mb is not None:
            arguments["bucket_cap_mb"] = bucket_cap_mb
        tape = ext.DistributedGradientTape(**arguments)
        registry.add(ext.rank(), tape.aggregator, timed=False)
        return tape

    DistributedGradientTape.__doc__ = original.__doc__
    module.DistributedGradientTape = DistributedGradientTape


def keras_patch(module, choice, registry, kind="data_parallel", optimizer_kwargs=None, bucket_cap_mb=None):
    original = module.DistributedOptimizer

    def DistributedOptimizer(*args, **kwargs):
        import horovod_ext.tensorflow.keras as ext

        arguments = _bind(original, args, kwargs)
        arguments["compression"] = choice if not isinstance(choice, str) else getattr(ext.Compression, choice)
        if kind == "diloco":
            optimizer = diloco_of(ext, arguments, original, optimizer_kwargs or {})
            registry.add(ext.rank(), optimizer, timed=False)
            return optimizer
        if bucket_cap_mb is not None:
            arguments["bucket_cap_mb"] = bucket_cap_mb
        optimizer = ext.DistributedOptimizer(**arguments)
        registry.add(ext.rank(), optimizer, timed=False)
        return optimizer

    DistributedOptimizer.__doc__ = original.__doc__
    module.DistributedOptimizer = DistributedOptimizer
    # Horovod's Keras callbacks target Keras 2 too: the script's callbacks resolve to horovod_ext's Keras 3 ones
    import horovod_ext.tensorflow.keras as ext

    module.callbacks = ext.callbacks
    horovod_callbacks = sys.modules.get("horovod.tensorflow.keras.callbacks")
    for name in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback"):
        if horovod_callbacks is not None and hasattr(ext.callbacks, name):
            setattr(horovod_callbacks, name, getattr(ext.callbacks, name))
    # elastic scripts: Horovod's elastic Keras API, for Keras 3 and horovod_ext's optimizer
    module.elastic = ext.elastic
    horovod_elastic = sys.modules.get("horovod.tensorflow.keras.elastic")
    if horovod_elastic is not None:
        for name in ext.elastic.__all__:
            setattr(horovod_elastic, name, getattr(ext.elastic, name))


def ddp_patch(module, choice, registry, kind="data_parallel"):
    """torch.nn.parallel.distributed: every DistributedDataParallel model the script makes (under torchrun, with no
    Horovod) gets horovod_ext.ddp's communication hook with the launcher's compression, its parameters named as
    DDP names them (less the "module." prefix); ``none`` leaves DDP's own averaging. The launcher's other
    optimizers are Horovod's: a DDP model under --optimizer diloco raises."""
    cls = module.DistributedDataParallel
    original = cls.__init__
    if getattr(original, "horovod_ext", False):
        return

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if kind != "data_parallel":
            raise ValueError(f"python -m horovod_ext.run --optimizer {kind}: a DistributedDataParallel model takes "
                             f"the launcher's compression as a communication hook (--optimizer data_parallel) "
                             f"only; {kind} runs on Horovod's DistributedOptimizer (horovodrun)")
        if choice == "none":
            return
        import horovod_ext.ddp as hx
        import torch.distributed as dist

        compression = getattr(hx.Compression, choice) if isinstance(choice, str) else choice
        state = hx.CompressionState(compression, process_group=self.process_group,
                                    named_parameters=self.named_parameters())
        register(self, state, hx.comm_hook)
        self._horovod_ext_launcher = choice
        registry.add(dist.get_rank(self.process_group), state)

    def register_comm_hook(self, state, hook):
        given = getattr(self, "_horovod_ext_launcher", None)
        if given is not None:
            name = given if isinstance(given, str) else given.name
            raise RuntimeError(f"python -m horovod_ext.run --compression {name} has registered its communication "
                               f"hook on this DistributedDataParallel model, which takes one hook; run the script "
                               f"without the launcher's --compression, or without its own register_comm_hook")
        return register(self, state, hook)

    register = cls.register_comm_hook
    __init__.horovod_ext = True
    cls.__init__, cls.register_comm_hook = __init__, register_comm_hook


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the named modules as usual, then patches them, once."""

    def __init__(self, patches):
        self.patches = dict(patches)
        self.loaders = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                self.loaders[fullname] = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec):
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        name = module.__spec__.name
        self.loaders[name].exec_module(module)
        module.__spec__.loader = self.loaders[name]
        self.patches.pop(name)(module)


def install(choice, registry, kind="data_parallel", optimizer_kwargs=None, bucket_cap_mb=None):
    patches = {"horovod.torch": lambda m: torch_patch(m, choice, registry, kind, optimizer_kwargs, bucket_cap_mb),
               "horovod.tensorflow": lambda m: tensorflow_patch(m, choice, registry, kind, bucket_cap_mb),
               "horovod.tensorflow.keras": lambda m: keras_patch(m, choice, registry, kind, optimizer_kwargs,
                                                                 bucket_cap_mb),
               "torch.nn.parallel.distributed": lambda m: ddp_patch(m, choice, registry, kind)}
    for name in list(patches):
        if name in sys.modules:  # already imported (by a sitecustomize, say): patch it now
            patches.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, _PatchAfterImport(patches))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    registry = Registry(args.compression if args.optimizer == "data_parallel" else
                        f"{args.compression} (pseudo-gradients of --optimizer {args.optimizer})")
    install(args.spec, registry, args.optimizer, args.optimizer_kwargs, args.bucket_cap_mb)
    if (args.optimizer_kwargs or {}).get("groups") is not None:
        # DiLoCo's worker groups are process sets made after the script's hvd.init(): Horovod's dynamic ones
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    script = os.path.abspath(args.script)
    sys.argv = [script] + list(args.script_args)
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
