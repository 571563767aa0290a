/* curand.c - the libs check for cuRAND (lib=curand): curandDestroyGenerator
 * of the default pseudo-random generator after one draw of 1 Mi floats.
 *
 * usage: libs_curand          prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<curand.h>)
#include <curand.h>

#define DRAW (1u << 20)

struct rng {
    float *data;
    curandGenerator_t gen;
};

/* cuRAND has no names for its codes. */
static const char *rng_rc(int rc)
{
    return rc == CURAND_STATUS_SUCCESS ? "ok" : libs_numbered("curandStatus", rc);
}

static bool rng_ok(curandStatus_t rc, const char *call)
{
    return libs_ok(rc == CURAND_STATUS_SUCCESS, call, rng_rc(rc));
}

/* A generator made, seeded and drawn from once, the device synchronised. */
static bool rng_make(struct rng *r)
{
    return rng_ok(curandCreateGenerator(&r->gen, CURAND_RNG_PSEUDO_DEFAULT),
                  "curandCreateGenerator") &&
           rng_ok(curandSetPseudoRandomGeneratorSeed(r->gen, 1234ull),
                  "curandSetPseudoRandomGeneratorSeed") &&
           rng_ok(curandGenerateUniform(r->gen, r->data, DRAW), "curandGenerateUniform") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int destroy_generator(void *r)
{
    return curandDestroyGenerator(((struct rng *)r)->gen);
}

int main(void)
{
    struct rng r = {0};
    int version = 0;
    libs_start("curand");
    if (rng_ok(curandGetVersion(&version), "curandGetVersion"))
        libs_info_int(version);
    if (!libs_cuda_zeros((void **)&r.data, DRAW * sizeof(float)) || !rng_make(&r) ||
        !rng_ok(curandDestroyGenerator(r.gen), "curandDestroyGenerator(warm-up)") ||
        !rng_make(&r))
        return libs_end();

    libs_baseline();
    libs_time("curandDestroyGenerator", "teardown", destroy_generator, &r, rng_rc);
    return libs_end();
}

#else
int main(void)
{
    return libs_no_header("curand", "curand.h");
}
#endif
