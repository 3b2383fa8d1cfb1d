// ZERO_HD: marks a function that compiles as host code and, under nvcc, as device code too (the
// formula headers core/adamw_step.h and core/cuda/kernel_math.h).
#pragma once

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__
#else
#define ZERO_HD
#endif
