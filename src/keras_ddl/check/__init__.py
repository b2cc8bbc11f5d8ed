"""``python -m keras_ddl.check``: a first-contact check of a cluster, run
under any launcher (ddlrun, mpiexec, srun, the MPI Operator). Every rank
prints where it runs, then an allreduce sweep, then rank 0 a verdict; the
exit code is non-zero when the verdict finds a problem.

``verdict.py`` holds the rules (pure functions of the measured table, unit
tested on made-up numbers); ``__main__.py`` measures and prints."""
