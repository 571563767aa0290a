/* cufft.c - the libs check for cuFFT (lib=cufft): cufftDestroy of a 1-D
 * complex plan after one execution.
 *
 * usage: libs_cufft           prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<cufft.h>)
#include <cufft.h>

#define FFT_SIZE 4096
#define FFT_BATCH 64

struct fft {
    cufftComplex *data;
    cufftHandle plan;
};

/* cuFFT has no names for its codes. */
static const char *fft_rc(int rc)
{
    return rc == CUFFT_SUCCESS ? "ok" : libs_numbered("cufftResult", rc);
}

static bool fft_ok(cufftResult rc, const char *call)
{
    return libs_ok(rc == CUFFT_SUCCESS, call, fft_rc(rc));
}

/* A plan made and executed once in place, the device synchronised. */
static bool fft_make(struct fft *f)
{
    return fft_ok(cufftPlan1d(&f->plan, FFT_SIZE, CUFFT_C2C, FFT_BATCH), "cufftPlan1d") &&
           fft_ok(cufftExecC2C(f->plan, f->data, f->data, CUFFT_FORWARD), "cufftExecC2C") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int destroy_plan(void *f)
{
    return cufftDestroy(((struct fft *)f)->plan);
}

int main(void)
{
    struct fft f = {0};
    int version = 0;
    libs_start("cufft");
    if (fft_ok(cufftGetVersion(&version), "cufftGetVersion"))
        libs_info_int(version);
    if (!libs_cuda_zeros((void **)&f.data, sizeof(cufftComplex) * FFT_SIZE * FFT_BATCH) ||
        !fft_make(&f) || !fft_ok(cufftDestroy(f.plan), "cufftDestroy(warm-up)") || !fft_make(&f))
        return libs_end();

    libs_baseline();
    libs_time("cufftDestroy", "teardown", destroy_plan, &f, fft_rc);
    return libs_end();
}

#else
int main(void)
{
    return libs_no_header("cufft", "cufft.h");
}
#endif
