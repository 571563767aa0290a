/* nccl.c - the libs check for NCCL (lib=nccl): a communicator of one rank
 * on device 0 (ncclCommInitAll with one device), one all-reduce on a
 * non-blocking stream of the program's, then ncclCommFinalize (which
 * flushes the communicator's own operations) and ncclCommDestroy.
 *
 * usage: libs_nccl            prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<nccl.h>)
#include <nccl.h>

#define COUNT (256 * 1024) /* floats: 1 MiB */

struct comm {
    float *data;
    cudaStream_t stream;
    ncclComm_t comm;
};

/* "nccl_<text>": NCCL's text for a code has blanks. */
static const char *comm_rc(int rc)
{
    char text[96];
    if (rc == ncclSuccess)
        return "ok";
    snprintf(text, sizeof text, "nccl_%s", ncclGetErrorString((ncclResult_t)rc));
    return libs_word(text);
}

static bool comm_ok(ncclResult_t rc, const char *call)
{
    return libs_ok(rc == ncclSuccess, call, comm_rc(rc));
}

/* A communicator made and used once: one all-reduce (a sum over one rank),
 * its stream synchronised. */
static bool comm_make(struct comm *c)
{
    const int devices[1] = {0};
    return comm_ok(ncclCommInitAll(&c->comm, 1, devices), "ncclCommInitAll") &&
           comm_ok(ncclAllReduce(c->data, c->data, COUNT, ncclFloat, ncclSum, c->comm, c->stream),
                   "ncclAllReduce") &&
           libs_cuda_ok(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
}

static int finalize_comm(void *c)
{
    return ncclCommFinalize(((struct comm *)c)->comm);
}

static int destroy_comm(void *c)
{
    return ncclCommDestroy(((struct comm *)c)->comm);
}

int main(void)
{
    struct comm c = {0};
    int version = 0;
    libs_start("nccl");
    if (comm_ok(ncclGetVersion(&version), "ncclGetVersion"))
        libs_info_int(version);
    if (!libs_cuda_zeros((void **)&c.data, COUNT * sizeof(float)) ||
        !libs_cuda_ok(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags") ||
        !comm_make(&c) || !comm_ok(finalize_comm(&c), "ncclCommFinalize(warm-up)") ||
        !comm_ok(destroy_comm(&c), "ncclCommDestroy(warm-up)") || !comm_make(&c))
        return libs_end();

    libs_baseline();
    libs_time("ncclCommFinalize", "teardown", finalize_comm, &c, comm_rc);
    libs_time("ncclCommDestroy", "teardown", destroy_comm, &c, comm_rc);
    return libs_end();
}

#else
int main(void)
{
    return libs_no_header("nccl", "nccl.h");
}
#endif
