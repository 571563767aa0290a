// rt.h - what the CUDA runtime programs of the GPU checks share.
#ifndef CUDEFER_GPU_RT_H
#define CUDEFER_GPU_RT_H

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// A runtime call that must succeed: else its error's name, and exit 2.
#define CK(call)                                                                  \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) {                                                  \
            fflush(stdout);                                                       \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,  \
                    cudaGetErrorName(e_));                                        \
            exit(2);                                                              \
        }                                                                         \
    } while (0)

#endif
