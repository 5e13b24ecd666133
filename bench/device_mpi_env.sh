# Sourced by the multi-GPU scripts on the H200 machines (after cd to the repo root): device_env.sh
# with the machine's own OpenMPI (mpirun and libmpi of one version), so the carried MPI libraries
# are left out of LD_LIBRARY_PATH (.devrun/lib-nompi links everything else in .devrun/lib).
# Defines mpi_launch NP: the mpirun prefix that passes the environment on.
MOE_DEVRUN_LIB=.devrun/lib-nompi . bench/device_env.sh
mkdir -p .devrun/lib-nompi
for f in .devrun/lib/*; do
  case "$(basename "$f")" in libmpi*|libopen-*|libhwloc*|libevent*) ;; *) ln -sf "$PWD/$f" .devrun/lib-nompi/ ;; esac
done
mpi_launch() {
  echo mpirun -np "$1" --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NVSHMEM_DISABLE_NVLS
}
