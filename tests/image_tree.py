"""Tiny folder-per-class JPEG trees for the data and example tests."""

import os


def write_image_tree(root, num_classes=3, per_class=4, size=(40, 56), seed=0):
    """Writes root/class_k/img_i.jpg (and one PNG); returns {class name: count}.

    Each class has its own mean colour so labels can be checked from pixels."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(seed)
    counts = {}
    for c in range(num_classes):
        name = f"class_{c:02d}"
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            h = size[0] + int(rng.integers(0, 8))
            w = size[1] + int(rng.integers(0, 8))
            pixels = np.clip(rng.normal(40 + 80 * c, 10, (h, w, 3)), 0, 255).astype(np.uint8)
            if i == 0:
                data = tf.io.encode_png(pixels).numpy()
                path = os.path.join(root, name, f"img_{i}.png")
            else:
                data = tf.io.encode_jpeg(pixels, quality=95).numpy()
                path = os.path.join(root, name, f"img_{i}.jpg")
            with open(path, "wb") as f:
                f.write(data)
        counts[name] = per_class
    return counts
