"""Convert a folder-per-class image tree into ImageNet-layout TFRecord shards.

    input_dir/
        class_a/ img1.jpg img2.png ...
        class_b/ ...

    python examples/convert_image_folder.py --input-dir input_dir --output-dir out \
        --split train --num-shards 128

It writes ``out/train-00000-of-00128`` ... (``tf.train.Example`` with
``image/encoded`` JPEG bytes, ``image/class/label`` int64, plus
``image/class/text``, ``image/filename``, ``image/height``, ``image/width``)
and ``out/labels.txt`` (one ``index<TAB>class name`` per line). Labels are
0..K-1 in sorted folder-name order (``--label-offset 1`` for the
1-based convention of some ImageNet tools). JPEG files are stored as they
are; other formats TensorFlow can decode (PNG, GIF, BMP) are re-encoded to
JPEG. Images are shuffled (``--seed``) before they are dealt to shards, so
every shard holds a mix of classes. Use at least as many shards as ranks.
Converting the eval split with the training label map: pass
``--labels out/labels.txt``.
"""

import argparse
import os
import random
import sys

EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")


def read_label_map(path):
    names = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                index, name = line.rstrip("\n").split("\t", 1)
                names[name] = int(index)
    return names


def scan(input_dir, label_map=None, label_offset=0):
    classes = sorted(d for d in os.listdir(input_dir)
                     if os.path.isdir(os.path.join(input_dir, d)))
    if not classes:
        raise SystemExit(f"convert_image_folder: no class folders in {input_dir!r}")
    if label_map is None:
        label_map = {c: i + label_offset for i, c in enumerate(classes)}
    missing = [c for c in classes if c not in label_map]
    if missing:
        raise SystemExit(f"convert_image_folder: classes not in the label map: {missing[:5]}")
    items = []
    for c in classes:
        folder = os.path.join(input_dir, c)
        for name in sorted(os.listdir(folder)):
            if name.lower().endswith(EXTENSIONS):
                items.append((os.path.join(folder, name), c, label_map[c]))
    if not items:
        raise SystemExit(f"convert_image_folder: no images under {input_dir!r}")
    return items, label_map


def to_jpeg(tf, path):
    data = open(path, "rb").read()
    if path.lower().endswith((".jpg", ".jpeg")):
        shape = tf.image.extract_jpeg_shape(data).numpy()
        return data, int(shape[0]), int(shape[1])
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    return tf.io.encode_jpeg(image, quality=95).numpy(), int(image.shape[0]), int(image.shape[1])


def make_example(tf, jpeg, label, text, filename, height, width):
    def b(v):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    def i(v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": b(jpeg),
        "image/format": b(b"JPEG"),
        "image/class/label": i(label),
        "image/class/text": b(text.encode()),
        "image/filename": b(os.path.basename(filename).encode()),
        "image/height": i(height),
        "image/width": i(width),
    }))


def convert(input_dir, output_dir, split="train", num_shards=1, seed=0, labels=None,
            label_offset=0):
    """Writes the shards and labels.txt; returns (shard paths, label map)."""
    import tensorflow as tf
    if num_shards < 1:
        raise SystemExit("convert_image_folder: --num-shards must be >= 1")
    label_map = read_label_map(labels) if labels else None
    items, label_map = scan(input_dir, label_map, label_offset)
    if num_shards > len(items):
        raise SystemExit(f"convert_image_folder: {num_shards} shards for {len(items)} images")
    random.Random(seed).shuffle(items)
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for s in range(num_shards):
        path = os.path.join(output_dir, f"{split}-{s:05d}-of-{num_shards:05d}")
        tmp = path + ".tmp"
        with tf.io.TFRecordWriter(tmp) as w:
            for filename, text, label in items[s::num_shards]:
                jpeg, h, wd = to_jpeg(tf, filename)
                w.write(make_example(tf, jpeg, label, text, filename, h, wd).SerializeToString())
        os.replace(tmp, path)
        paths.append(path)
    if not labels:
        with open(os.path.join(output_dir, "labels.txt"), "w") as f:
            for name, index in sorted(label_map.items(), key=lambda kv: kv[1]):
                f.write(f"{index}\t{name}\n")
    return paths, label_map


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input-dir", required=True, help="one folder of images per class")
    p.add_argument("--output-dir", required=True,
                   help="where the shards and labels.txt are written (made if missing)")
    p.add_argument("--split", default="train",
                   help="shard name prefix: train, validation, ... (default: train)")
    p.add_argument("--num-shards", type=int, default=1,
                   help="number of files; at least the number of ranks (default: 1)")
    p.add_argument("--seed", type=int, default=0,
                   help="shuffle of the images before they are dealt to shards (default: 0)")
    p.add_argument("--labels", help="existing labels.txt to use (e.g. for the eval split)")
    p.add_argument("--label-offset", type=int, default=0,
                   help="first label number; 1 for the 1-based ImageNet convention "
                   "(default: 0)")
    a = p.parse_args(argv)
    paths, label_map = convert(a.input_dir, a.output_dir, a.split, a.num_shards, a.seed,
                               a.labels, a.label_offset)
    print(f"wrote {len(paths)} shards, {len(label_map)} classes to {a.output_dir}")


if __name__ == "__main__":
    sys.exit(main())
