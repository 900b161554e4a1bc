// SPDX-License-Identifier: MIT
// NF4_HD: marks a function that both the host and CUDA device code call (a plain function where
// the compiler is not nvcc), so that headers of pure arithmetic serve both.
#pragma once

#if defined(__CUDACC__)
#define NF4_HD __host__ __device__
#else
#define NF4_HD
#endif
