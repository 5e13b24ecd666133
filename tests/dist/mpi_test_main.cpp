// main() for tests run under mpirun: initializes MPI, runs the tests on every rank, and makes
// the exit code the same everywhere (a failure on any rank fails the job). Every rank prints its
// own GoogleTest output, so a failure shows on the rank where it happened.
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  // As MpiRuntime asks: the overlapped gradient reduction calls MPI from a worker thread.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
