// A fixture for tests that run under mpirun: the world communicator and one temporary directory for
// the whole job (every rank must run the same config, run.dir included): rank 0 creates it and
// broadcasts its name, and removes it once every rank is done with the test.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "moe/comm/mpi_communicator.h"

namespace moe::testing {

class JobTempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    char dir[256] = {0};
    if (world_->rank() == 0) {
      char tmpl[] = "/tmp/moetrain-job-XXXXXX";
      const char* made = mkdtemp(tmpl);
      ASSERT_NE(made, nullptr) << "mkdtemp failed";
      std::strncpy(dir, made, sizeof(dir) - 1);
    }
    MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    dir_ = dir;
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_->rank() == 0) std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<MpiCommunicator> world_;
  std::string dir_;
};

}  // namespace moe::testing
