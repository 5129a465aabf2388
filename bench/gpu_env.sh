# Sourced by the bench/gpu_*.sh scripts on the GPU machine: the CUDA and
# PyTorch-bundled library folders (cuBLAS, NVRTC, NCCL) on LD_LIBRARY_PATH,
# and NVIDIA_PY_LIB = the folder holding PyTorch's nvidia/* packages; the
# test programs print each case as it starts (tests/check.h), so one killed
# by a time limit says how far it got.
NVIDIA_PY_LIB=$(python3 -c 'import nvidia, os; print(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia"))' 2>/dev/null)
for d in /usr/local/cuda/lib64 ${NVIDIA_PY_LIB:+$NVIDIA_PY_LIB/cublas/lib $NVIDIA_PY_LIB/cuda_nvrtc/lib $NVIDIA_PY_LIB/nccl/lib}; do
    [ -d "$d" ] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done
export LD_LIBRARY_PATH
export MOEGEN_TEST_PROGRESS=1
