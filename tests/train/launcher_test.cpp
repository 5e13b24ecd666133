// Launcher detection: MPI launchers are recognized from their variables; launchers that start
// several processes without MPI (torchrun, srun --mpi=none) are refused with the supported
// launchers named, so N processes never become N independent single-rank jobs.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "moe/comm/launcher.h"

namespace moe {
namespace {

// Sets the given variables for one test and clears every launcher variable around it.
class Env {
 public:
  explicit Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    clear();
    for (const auto& [k, v] : vars) setenv(k, v, 1);
  }
  ~Env() { clear(); }

 private:
  static void clear() {
    for (const char* k : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "WORLD_SIZE", "RANK",
                          "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_STEP_ID",
                          "SLURM_JOB_ID"})
      unsetenv(k);
  }
};

TEST(Launcher, NoVariablesIsOneProcess) {
  Env e({});
  EXPECT_EQ(detect_launcher().kind, Launcher::Single);
}

TEST(Launcher, MpiLaunchersAreRecognized) {
  {
    Env e({{"OMPI_COMM_WORLD_SIZE", "4"}});
    EXPECT_EQ(detect_launcher().kind, Launcher::Mpi);
    EXPECT_EQ(detect_launcher().name, "mpirun (OpenMPI)");
  }
  {
    // srun --mpi=pmix: PMIx variables plus Slurm's (simulated; no PMIx server is started).
    Env e({{"PMIX_RANK", "1"}, {"SLURM_JOB_ID", "77"}, {"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"},
           {"SLURM_STEP_ID", "0"}});
    EXPECT_EQ(detect_launcher().kind, Launcher::Mpi);
    EXPECT_EQ(detect_launcher().name, "srun (PMIx)");
  }
  {
    Env e({{"PMI_SIZE", "2"}, {"PMI_RANK", "0"}});
    EXPECT_EQ(detect_launcher().kind, Launcher::Mpi);
  }
}

TEST(Launcher, TorchrunWithSeveralProcessesIsRefusedNamingTheSupportedLaunchers) {
  Env e({{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  const LaunchInfo info = detect_launcher();
  EXPECT_EQ(info.kind, Launcher::Refused);
  EXPECT_NE(info.why.find("torchrun"), std::string::npos) << info.why;
  EXPECT_NE(info.why.find("WORLD_SIZE=8"), std::string::npos) << info.why;
  EXPECT_NE(info.why.find("mpirun -np N"), std::string::npos) << info.why;
  EXPECT_NE(info.why.find("srun --mpi=pmix"), std::string::npos) << info.why;
}

TEST(Launcher, TorchrunWithOneProcessIsOneProcess) {
  Env e({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(detect_launcher().kind, Launcher::Single);
}

TEST(Launcher, SrunWithoutPmiIsRefused) {
  Env e({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_ID", "5"}});
  const LaunchInfo info = detect_launcher();
  EXPECT_EQ(info.kind, Launcher::Refused);
  EXPECT_NE(info.why.find("SLURM_NTASKS=4"), std::string::npos) << info.why;
}

TEST(Launcher, ASingleTaskSlurmAllocationIsOneProcess) {
  // sbatch runs the batch script as task 0 of 1; and a one-task srun.
  Env e({{"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_JOB_ID", "5"}});
  EXPECT_EQ(detect_launcher().kind, Launcher::Single);
}

}  // namespace
}  // namespace moe
