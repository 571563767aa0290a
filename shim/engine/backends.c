/* backends.c - the rows: how each kind is really released. Every release
 * here may wait for the GPU (that is what the driver's own calls do). */
#include "backends.h"

#include "driver.h"

static CUresult release_device(const struct cd_record *r)
{
    return cd_driver_ops()->mem_free((CUdeviceptr)r->key);
}

static CUresult release_host(const struct cd_record *r)
{
    return cd_driver_ops()->mem_free_host((void *)r->key);
}

static CUresult release_registered(const struct cd_record *r)
{
    return cd_driver_ops()->mem_host_unregister((void *)r->key);
}

static CUresult release_array(const struct cd_record *r)
{
    return cd_driver_ops()->array_destroy((CUarray)r->key);
}

static CUresult release_mipmapped(const struct cd_record *r)
{
    return cd_driver_ops()->mipmapped_array_destroy((CUmipmappedArray)r->key);
}

static CUresult release_module(const struct cd_record *r)
{
    return cd_driver_ops()->module_unload((CUmodule)r->key);
}

static CUresult release_library(const struct cd_record *r)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    return ops->library_unload ? ops->library_unload((CUlibrary)r->key) : CUDA_ERROR_NOT_FOUND;
}

#define VALUE CUDA_ERROR_INVALID_VALUE
#define HANDLE CUDA_ERROR_INVALID_HANDLE
#define UNREGISTERED CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
#define DESTROYED CUDA_ERROR_CONTEXT_IS_DESTROYED
/* The driver answers: a host address never crashes it. */
#define ASK CUDA_SUCCESS

/* Managed memory has no stream-ordered free (cuMemFreeAsync answers
 * CUDA_ERROR_NOT_SUPPORTED); a mipmapped array is taken to answer as an
 * array; libraries outlive contexts. */
static const struct cd_backend rows[CD_KIND_COUNT] = {
    /*               option              stream reuse  pages  freed  double        torn          release */
    [CD_DEVICE]     = {CD_OPT_DEVICE,     true,  true,  false, true,  VALUE,        VALUE,        release_device},
    [CD_MANAGED]    = {CD_OPT_MANAGED,    false, true,  false, true,  VALUE,        VALUE,        release_device},
    [CD_HOST]       = {CD_OPT_HOST,       false, true,  false, true,  VALUE,        VALUE,        release_host},
    [CD_REGISTERED] = {CD_OPT_REGISTERED, false, false, true,  true,  UNREGISTERED, ASK,          release_registered},
    [CD_ARRAY]      = {CD_OPT_ARRAY,      false, false, false, true,  HANDLE,       DESTROYED,    release_array},
    [CD_MIPMAPPED]  = {CD_OPT_ARRAY,      false, false, false, true,  HANDLE,       DESTROYED,    release_mipmapped},
    [CD_MODULE]     = {CD_OPT_MODULE,     false, false, false, true,  HANDLE,       HANDLE,       release_module},
    [CD_LIBRARY]    = {CD_OPT_LIBRARY,    false, false, false, false, HANDLE,       HANDLE,       release_library},
};

#undef VALUE
#undef HANDLE
#undef UNREGISTERED
#undef DESTROYED
#undef ASK

const struct cd_backend *cd_backend(enum cd_kind kind)
{
    return &rows[kind];
}

bool cd_backend_on(enum cd_kind kind)
{
    return cd_option_int(rows[kind].option) != 0;
}
