"""The DiLoCo benchmark methods' names, parsed once for benchmarks/diloco_worker.py (the language model, AdamW inner
steps) and benchmarks/tta_worker.py (gravac_models.py's models, SGD inner steps):

    diloco[-ternary|-topk][-h<H>][-lr<outer lr>][-m<outer momentum>][-p<fragments>][-t<overlap>][-a<merge alpha>]
          [-leader][-node]

"ternary": ternary pseudo-gradients with error feedback; "topk": top-k 1% (error feedback, its default); neither: dense
fp32. "-h50" sets inner_steps, "-lr0.35" outer_lr, "-m0.5" outer_momentum, "-p4" fragments (Streaming DiLoCo), "-t6"
overlap, "-a0.5" merge_alpha, "-leader" outer="leader", "-node" groups="node". Left out, each is DiLoCoOptimizer's
default (or the benchmark's --inner-steps).
"""
COMPRESSIONS = {"none": lambda hx: hx.Compression.none,  # of an adapter: horovod_ext.torch or horovod_ext.ddp
                "ternary": lambda hx: hx.Compression.ternary(error_feedback=True),
                "topk": lambda hx: hx.Compression.topk(ratio=0.01)}
NUMBERS = {"h": ("inner_steps", int), "lr": ("outer_lr", float), "m": ("outer_momentum", float),
           "p": ("fragments", int), "t": ("overlap", int), "a": ("merge_alpha", float)}


def _number(part):
    """('h', '50') for 'h50'; None where `part` is not a prefix of NUMBERS followed by its kind of number."""
    prefix = next((p for p in NUMBERS if part.startswith(p)), None)  # no prefix begins another
    try:
        NUMBERS[prefix][1](part[len(prefix):])
    except (KeyError, TypeError, ValueError):
        return None
    return prefix, part[len(prefix):]


def is_diloco(method):
    """Whether `method` is a well-formed DiLoCo method name (see the module's docstring)."""
    if not method.startswith("diloco"):
        return False
    parts = method.split("-")
    return parts[0] == "diloco" and all(p in COMPRESSIONS or p in ("node", "leader") or _number(p) for p in parts[1:])


def diloco_settings(method, inner_steps=None):
    """DiLoCoOptimizer's keyword arguments named by `method` (compression as a name of COMPRESSIONS); inner_steps
    is `inner_steps` unless the name says -h<H>, and left out (the default) where both are None."""
    if not is_diloco(method):
        raise ValueError(f"method {method!r}: not diloco[-ternary|-topk][-h<H>][-lr<x>][-m<x>][-p<P>][-t<tau>]"
                         f"[-a<alpha>][-leader][-node]")
    parts = method.split("-")[1:]
    settings = {"compression": next((p for p in parts if p in COMPRESSIONS), "none"),
                "groups": "node" if "node" in parts else None, "outer": "leader" if "leader" in parts else "average"}
    if inner_steps is not None:
        settings["inner_steps"] = inner_steps
    for prefix, value in filter(None, map(_number, parts)):
        name, kind = NUMBERS[prefix]
        settings[name] = kind(value)
    return settings


def diloco_optimizer(method, optimizer, named_parameters, inner_steps=None, hx=None):
    """The DiLoCoOptimizer `method` names, around `optimizer`, of the adapter `hx` (default horovod_ext.torch;
    horovod_ext.ddp under torchrun)."""
    if hx is None:
        import horovod_ext.torch as hx
    settings = diloco_settings(method, inner_steps)
    compression = COMPRESSIONS[settings.pop("compression")](hx)
    return hx.DiLoCoOptimizer(optimizer, named_parameters, compression=compression, **settings)
