"""Units and the alpha-beta link: a message of m bytes over a link costs
``alpha + m / bandwidth``. Also the checks and the node / rack arithmetic
every allreduce model shares."""

from dataclasses import dataclass

GB = 1e9          # bandwidths are in decimal GB/s, as vendors and nccl-tests quote them
US = 1e-6
MS = 1e-3
FP32 = 4          # bytes per gradient element


@dataclass(frozen=True)
class Link:
    """One hop: ``alpha`` seconds per message plus ``bytes / bandwidth``.

    ``bandwidth`` is per direction. For the inter-node link it is what one
    node's network interface sustains; ranks of a node that send across nodes
    at the same time share it.
    """
    alpha: float
    bandwidth: float

    @property
    def beta(self):
        return 1.0 / self.bandwidth

    def cost(self, nbytes, flows=1):
        """One message of nbytes while ``flows`` messages share the link."""
        return self.alpha + nbytes * flows * self.beta


def _check(n, nbytes):
    if int(n) != n or n < 1:
        raise ValueError(f"number of ranks must be a positive integer, got {n}")
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0 bytes, got {nbytes}")


def _nodes(n, local):
    if local < 1:
        raise ValueError(f"ranks per node must be >= 1, got {local}")
    if n <= local:
        return 1, n
    if n % local:
        raise ValueError(f"{n} ranks do not fill nodes of {local}")
    return n // local, local


def _rack_count(nodes, nodes_per_rack):
    """Racks of nodes_per_rack nodes (0: one switch, a single rack)."""
    if not nodes_per_rack or nodes <= nodes_per_rack:
        return 1
    if nodes % nodes_per_rack:
        raise ValueError(f"{nodes} nodes do not fill racks of {nodes_per_rack}")
    return nodes // nodes_per_rack
