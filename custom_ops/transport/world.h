// Where the engine gets its world: the one factory of the transport that
// carries a job. Today that is MPI (mpi_world.h); another data plane (a GPU
// fabric, a socket transport) is a new case here, not a change above
// transport/.
#pragma once

#include <memory>
#include <string>

#include "../common/types.h"
#include "group.h"

namespace ddl {

// The Group of every rank of this job, over the transport this build carries.
Status OpenWorld(std::unique_ptr<Group>* out);

// The library under that transport, by its own words (for version checks and
// reports: mpi4py in the same process must use the same MPI).
std::string WorldLibraryVersion();

}  // namespace ddl
