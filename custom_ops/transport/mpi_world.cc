#include "mpi_world.h"

#include <mpi.h>

#include "mpi_transport.h"

namespace ddl {

Status OpenMpiWorld(std::unique_ptr<Group>* out) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::FailedPrecondition("MPI has already been finalized in this process");
  }
  int provided = 0;
  if (!initialized) {
    int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (code != MPI_SUCCESS) return Status::Internal("MPI_Init_thread failed: " + MpiErrorString(code));
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return Status::FailedPrecondition(
        "MPI was initialised with thread level " + std::to_string(provided) +
        " but keras_ddl needs MPI_THREAD_MULTIPLE; initialise MPI through keras_ddl.init() "
        "or mpi4py's default thread level" + OnRank(rank));
  }
  MPI_Comm world = MPI_COMM_NULL;
  const int code = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (code != MPI_SUCCESS) {
    return Status::Internal("MPI_Comm_dup of MPI_COMM_WORLD failed: " + MpiErrorString(code));
  }
  try {
    *out = std::make_unique<MpiTransport>(world);  // frees `world` if it throws
  } catch (const TransportError& e) {
    return Status::Internal(std::string("setting up the world's communicator failed: ") +
                            e.what());
  }
  return Status::Ok();
}

std::string MpiLibraryVersion() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  const int code = MPI_Get_library_version(version, &length);
  if (code != MPI_SUCCESS) return "unknown (MPI_Get_library_version: " + MpiErrorString(code) + ")";
  return std::string(version, length);
}

}  // namespace ddl
