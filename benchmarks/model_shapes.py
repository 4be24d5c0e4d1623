"""Writes horovod_ext/perfmodel/models/*.json: the trainable tensor shapes of ResNet-50 and VGG-16 (torchvision's
definitions, ImageNet, 1000 classes) and BERT-base (uncased, BertModel with its pooler), from the architectures'
published layer lists, checked against their published parameter counts. Run once; the package ships the data."""
import json
import math
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "horovod_ext", "perfmodel", "models")


def conv(cin, cout, k):
    return [(cout, cin, k, k)]


def bn(c):
    return [(c,), (c,)]


def resnet50():
    shapes = conv(3, 64, 7) + bn(64)
    cin = 64
    for width, blocks, in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += conv(cin, width, 1) + bn(width) + conv(width, width, 3) + bn(width)
            shapes += conv(width, 4 * width, 1) + bn(4 * width)
            if b == 0:
                shapes += conv(cin, 4 * width, 1) + bn(4 * width)
            cin = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def vgg16():
    shapes, cin = [], 3
    for cout in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
        shapes += conv(cin, cout, 3) + [(cout,)]
        cin = cout
    return shapes + [(4096, 25088), (4096,), (4096, 4096), (4096,), (1000, 4096), (1000,)]


def bert_base(hidden=768, layers=12, intermediate=3072, vocab=30522, positions=512):
    shapes = [(vocab, hidden), (positions, hidden), (2, hidden), (hidden,), (hidden,)]
    for _ in range(layers):
        for _ in range(4):  # query, key, value, attention output
            shapes += [(hidden, hidden), (hidden,)]
        shapes += [(hidden,), (hidden,), (intermediate, hidden), (intermediate,), (hidden, intermediate), (hidden,),
                   (hidden,), (hidden,)]
    return shapes + [(hidden, hidden), (hidden,)]  # pooler


MODELS = {
    "resnet50": (resnet50, 25_557_032, 0.18, "ResNet-50, ImageNet (torchvision)", "batch 64 per GPU, fp32, V100"),
    "vgg16": (vgg16, 138_357_544, 0.32, "VGG-16, ImageNet (torchvision)", "batch 64 per GPU, fp32, V100"),
    "bert-base": (bert_base, 109_482_240, 0.25, "BERT-base uncased (BertModel with pooler)",
                  "batch 32 of 128 tokens per GPU, fp32, V100"),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (build, published, compute, title, setting) in MODELS.items():
        shapes = build()
        count = sum(math.prod(s) for s in shapes)
        assert count == published, (name, count, published)
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump({"name": name, "title": title, "parameters": count, "compute_seconds": compute,
                       "compute_note": f"assumed forward+backward seconds per step, {setting}: an order of "
                                       f"magnitude to start from, not a measurement; pass your own",
                       "shapes": [list(s) for s in shapes]}, f)
            f.write("\n")
        print(name, count, len(shapes))


if __name__ == "__main__":
    main()
