/* cuda_all.h - cuda.h with every versioned name declared.
 *
 * With __CUDA_API_VERSION_INTERNAL, cuda.h declares each ELF name the driver
 * exports (cuMemFree and cuMemFree_v2, cuStreamBeginCapture and its _v2 and
 * _ptsz forms, ...) with its own prototype and defines no name-mapping
 * macros, so the compiler checks every wrapper against the driver's
 * prototype of exactly that name. Only the interposition layer uses it.
 */
#ifndef CUDEFER_CUDA_ALL_H
#define CUDEFER_CUDA_ALL_H

#ifdef __CUDA_API_H__
#error "cuda_all.h must be included before any other header that includes cuda.h"
#endif
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#endif
