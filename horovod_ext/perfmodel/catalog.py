"""The tensor shapes of well-known models, shipped as data (models/*.json, written by benchmarks/model_shapes.py from
the architectures' layer lists and checked against their published parameter counts), and a reader for a user's
own shapes file."""
import json
import math
import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
NAMES = sorted(f[:-5] for f in os.listdir(HERE) if f.endswith(".json"))


def load(name_or_path):
    """{name, parameters, compute_seconds (None if unknown), shapes} of a named model (NAMES) or of a file: JSON
    (a list of shapes, or an object with "shapes") or text, one shape per line ("512,64" or "1000")."""
    path = os.path.join(HERE, f"{name_or_path}.json") if name_or_path in NAMES else name_or_path
    if not os.path.exists(path):
        raise ValueError(f"model must be one of {NAMES} or a file of tensor shapes, got {name_or_path!r}")
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [[int(d) for d in line.replace("x", ",").split(",") if d.strip()]
                for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if isinstance(data, list):
        data = {"name": os.path.basename(path), "shapes": data}
    shapes = [tuple(int(d) for d in s) if isinstance(s, (list, tuple)) else (int(s),) for s in data["shapes"]]
    if not shapes or any(not s or min(s) < 1 for s in shapes):
        raise ValueError(f"{path}: every tensor shape must have dimensions >= 1")
    return {"name": data.get("name", os.path.basename(path)), "title": data.get("title", ""),
            "parameters": sum(math.prod(s) for s in shapes), "compute_seconds": data.get("compute_seconds"),
            "compute_note": data.get("compute_note", ""), "shapes": shapes}

