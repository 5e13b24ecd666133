#include "moe/comm/launcher.h"

#include <cstdlib>

namespace moe {

namespace {

const char* env(const char* name) { return std::getenv(name); }

// The value of an integer environment variable, or -1 when it is absent or not a number.
long env_int(const char* name) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' ? n : -1;
}

constexpr const char* kSupported =
    "moetrain's ranks are MPI processes: launch with `mpirun -np N moetrain ...` (OpenMPI) or `srun --mpi=pmix "
    "moetrain ...` (Slurm with PMIx); one process needs no launcher";

}  // namespace

LaunchInfo detect_launcher() {
  LaunchInfo info;
  if (env("OMPI_COMM_WORLD_SIZE")) {
    info.kind = Launcher::Mpi;
    info.name = "mpirun (OpenMPI)";
    return info;
  }
  if (env("PMIX_RANK")) {
    info.kind = Launcher::Mpi;
    info.name = env("SLURM_JOB_ID") ? "srun (PMIx)" : "a PMIx launcher";
    return info;
  }
  if (env("PMI_SIZE") || env("PMI_RANK")) {
    info.kind = Launcher::Mpi;
    info.name = env("SLURM_JOB_ID") ? "srun (PMI)" : "a PMI launcher";
    return info;
  }
  // Several processes started without MPI.
  const long torch_world = env_int("WORLD_SIZE");
  if (torch_world > 1 || (env("RANK") && env("MASTER_ADDR") && torch_world != 1)) {
    info.kind = Launcher::Refused;
    info.name = "torchrun";
    info.why = std::string("this process was started by torchrun or another torch.distributed launcher (RANK=") +
               (env("RANK") ? env("RANK") : "?") + ", WORLD_SIZE=" + (env("WORLD_SIZE") ? env("WORLD_SIZE") : "?") +
               "), which moetrain does not bootstrap from; " + kSupported;
    return info;
  }
  if (env_int("SLURM_NTASKS") > 1 && env("SLURM_PROCID") && env("SLURM_STEP_ID")) {
    info.kind = Launcher::Refused;
    info.name = "srun without MPI";
    info.why = std::string("this process is one of SLURM_NTASKS=") + env("SLURM_NTASKS") +
               " tasks of srun, but srun gave it no PMI or PMIx (srun --mpi=none?): the tasks would train as " +
               "independent jobs; " + kSupported;
    return info;
  }
  info.name = "none (one process)";
  return info;
}

}  // namespace moe
