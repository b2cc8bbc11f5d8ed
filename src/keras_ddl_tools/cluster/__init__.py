"""Try a multi-node topology on one Linux machine: network namespaces with
shaped links stand in for servers (see netns.py and ``python -m
keras_ddl.cluster --help``)."""

from .netns import (MPI_ENV, ClusterError, NetnsCluster, find_mpiexec, missing_requirements,
                    parse_burst, parse_rate)
from .slurm import SlurmCluster, SlurmError, missing_slurm

__all__ = ["NetnsCluster", "ClusterError", "MPI_ENV", "find_mpiexec", "missing_requirements",
           "parse_burst", "parse_rate", "SlurmCluster", "SlurmError", "missing_slurm"]
