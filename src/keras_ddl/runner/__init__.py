"""``ddlrun``: launch a training script on N processes through the MPI launcher."""
