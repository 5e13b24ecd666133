// This process's rank among the ranks of its job on its host, as the launcher says
// (OMPI_COMM_WORLD_LOCAL_RANK from mpirun, SLURM_LOCALID from srun, LOCAL_RANK from torchrun); 0
// without one. It picks a GPU per rank, and the one rank per host that says a host-wide wait.
#pragma once

namespace moe {

int local_rank();

}  // namespace moe
