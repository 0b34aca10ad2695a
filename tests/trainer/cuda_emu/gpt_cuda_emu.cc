/*
 * worker/trainer/gpt_cuda.cu compiled by the host's C++ compiler against cuda_emu's CUDA
 * (cuda_runtime.h says what that is and is not), for tests/trainer/test_gpt_cuda.c on a
 * machine without a GPU.
 */
#include "gpt_cuda.cu"
