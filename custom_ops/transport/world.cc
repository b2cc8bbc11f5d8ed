#include "world.h"

#include "mpi_world.h"

namespace ddl {

Status OpenWorld(std::unique_ptr<Group>* out) { return OpenMpiWorld(out); }

std::string WorldLibraryVersion() { return MpiLibraryVersion(); }

}  // namespace ddl
