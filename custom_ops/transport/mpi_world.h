// The one place that turns MPI_COMM_WORLD into a Group, so nothing above
// transport/ includes mpi.h or calls MPI.
#pragma once

#include <memory>
#include <string>

#include "../common/types.h"
#include "group.h"

namespace ddl {

// Initialises MPI if nobody has (thread level MULTIPLE is required, as
// Python may call MPI through mpi4py while the engine thread runs) and
// returns a Group over a duplicate of MPI_COMM_WORLD, so user traffic on
// MPI_COMM_WORLD never matches the engine's.
Status OpenMpiWorld(std::unique_ptr<Group>* out);

// The MPI library this core was linked against (MPI_Get_library_version).
std::string MpiLibraryVersion();

}  // namespace ddl
