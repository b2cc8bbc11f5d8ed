"""What two nodes of the namespace cluster cost each other with no
collectives at all: ResNet-50 trained by plain Keras on 1 rank, then on 2
nodes x 1 rank at once (each alone), with keras_ddl's engine as it comes,
with its thread at normal priority, and negotiating only once a second
while idle. Launches alternate; needs root (docs/PERFORMANCE.md, "Machine
and communication").

    sudo python docs/scripts/machine_probe.py [ROUNDS]
"""

import argparse
import statistics
import sys
import tempfile

from keras_ddl_tools.bench.fit_cluster import _launch
from keras_ddl_tools.cluster import NetnsCluster

ARGS = argparse.Namespace(batch=8, steps=5, reps=2, threads=1, model="resnet50", image_size=128)
VARIANTS = {
    "engine as it comes": {},
    "DDL_ENGINE_PRIORITY=normal": {"DDL_ENGINE_PRIORITY": "normal"},
    "DDL_CYCLE_TIME_MS=1000": {"DDL_CYCLE_TIME_MS": "1000"},
}


def main(rounds):
    steps = {name: [] for name in ("1 rank", *VARIANTS)}
    with NetnsCluster(2, "1gbit") as cluster, tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for i, (name, env) in enumerate([("1 rank", {}), *VARIANTS.items()]):
                nodes = 1 if name == "1 rank" else 2
                result = _launch(cluster, nodes, ARGS, env, f"{tmp}/{i}.{r}.json",
                                 independent=True)
                steps[name] += [wall for wall, _ in result["step_s"]["plain"]]
    one = statistics.median(steps["1 rank"])
    print(f"# plain Keras ResNet-50 128 px, batch 8: 1 rank {one * 1e3:.0f} ms a step; "
          f"2 nodes x 1 rank, each alone ({rounds} launches each):")
    for name in VARIANTS:
        many = statistics.median(steps[name])
        print(f"{name:>28}  {many * 1e3:7.0f} ms  machine {one / many:.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
