// Faults at the core's C boundary, for tests/unit/test_single_process.py: a
// library preloaded (LD_PRELOAD) into the Python process that loads the
// core, standing in front of two MPI calls and of operator new.
//
//   ddl_fault_mpi("MPI_Comm_dup")   the next call of that MPI function (or of
//   ddl_fault_mpi("MPI_Comm_set_errhandler")   that one) returns MPI_ERR_OTHER
//                                   without reaching MPI, as a broken fabric does
//   ddl_fault_allocations(n)        the next n allocations of the calling thread
//                                   throw std::bad_alloc, as a full machine does
//
// Everything not faulted goes on to MPI's own entry points (found in the
// loaded libmpi) and to malloc.
#include <dlfcn.h>
#include <mpi.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

enum MpiFault { kNone, kCommDup, kSetErrhandler };
std::atomic<int> mpi_fault{kNone};
thread_local int failing_allocations = 0;

// MPI's own function `name` (its PMPI_ profiling entry), from the libmpi
// this process loaded.
void* Real(const char* name) {
  void* mpi = dlopen("libmpi.so.12", RTLD_LAZY | RTLD_NOLOAD);
  void* f = mpi ? dlsym(mpi, name) : nullptr;
  if (f == nullptr) std::abort();  // no MPI loaded: nothing to stand in front of
  return f;
}

bool Take(MpiFault fault) {
  int expected = fault;
  return mpi_fault.compare_exchange_strong(expected, kNone);
}

}  // namespace

extern "C" {

int ddl_fault_mpi(const char* function) {
  if (std::strcmp(function, "MPI_Comm_dup") == 0) {
    mpi_fault = kCommDup;
  } else if (std::strcmp(function, "MPI_Comm_set_errhandler") == 0) {
    mpi_fault = kSetErrhandler;
  } else {
    return -1;
  }
  return 0;
}

void ddl_fault_allocations(int n) { failing_allocations = n; }

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
  if (Take(kCommDup)) return MPI_ERR_OTHER;
  using Fn = int (*)(MPI_Comm, MPI_Comm*);
  static Fn real = reinterpret_cast<Fn>(Real("PMPI_Comm_dup"));
  return real(comm, newcomm);
}

int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler handler) {
  if (Take(kSetErrhandler)) return MPI_ERR_OTHER;
  using Fn = int (*)(MPI_Comm, MPI_Errhandler);
  static Fn real = reinterpret_cast<Fn>(Real("PMPI_Comm_set_errhandler"));
  return real(comm, handler);
}

}  // extern "C"

void* operator new(std::size_t bytes) {
  if (failing_allocations > 0) {
    --failing_allocations;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
