// How this process was launched, read from the environment before MPI is initialized. moetrain's
// ranks are MPI processes: mpirun (OpenMPI), srun with PMI or PMIx, or any launcher that sets the
// PMI variables. Launchers that start several processes without MPI (torchrun and other
// torch.distributed launchers, srun --mpi=none) would otherwise turn one job into N independent
// single-rank jobs writing into one run directory: they are recognized and refused.
#pragma once

#include <string>

namespace moe {

enum class Launcher {
  Single,    // one process, no launcher: no MPI
  Mpi,       // mpirun / srun with PMI or PMIx: initialize MPI
  Refused,   // several processes without MPI: an error (see `why`)
};

struct LaunchInfo {
  Launcher kind = Launcher::Single;
  std::string name;  // "mpirun (OpenMPI)", "srun (PMIx)", "torchrun", ...
  std::string why;   // for Refused: the error message, naming the supported launchers
};

LaunchInfo detect_launcher();

}  // namespace moe
