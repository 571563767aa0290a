/* devices.c - cuInit, driver version, device queries, configuration.
 *
 * Configuration comes from the environment (see testdriver.h) and is read
 * once, at the first of cuInit / cuDriverGetVersion / cuGetProcAddress. */
#include "internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB ((size_t)1 << 30)

static bool config_loaded;

/* Parses a byte count with an optional k/m/g suffix (powers of 1024);
 * returns dflt when unset or unparsable. */
static size_t env_bytes(const char *name, size_t dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    case '\0': break;
    default: return dflt;
    }
    return (size_t)v;
}

static int env_int(const char *name, int dflt, int min, int max)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    long v = strtol(s, NULL, 10);
    return v < min || v > max ? dflt : (int)v;
}

/* Loads the configuration once (td.mu held). */
void td_config_ensure(void)
{
    if (config_loaded)
        return;
    config_loaded = true;
    td.version = env_int("TESTDRIVER_VERSION", 13000, 2000, 1000000);
    td.ndevices = env_int("TESTDRIVER_DEVICES", 1, 0, TD_MAX_DEVICES);
    size_t device_bytes = env_bytes("TESTDRIVER_DEVICE_BYTES", GIB);
    for (int d = 0; d < TD_MAX_DEVICES; d++)
        td.cap_total[td_cap_dev(d)] = device_bytes;
    td.cap_total[TD_CAP_HOST] = env_bytes("TESTDRIVER_HOST_BYTES", GIB);
    td.managed_moves = env_int("TESTDRIVER_CONCURRENT_MANAGED", 1, 0, 1);
    const char *exit_mode = getenv("TESTDRIVER_EXIT");
    td.exit_handler = exit_mode && strcmp(exit_mode, "atexit") == 0;
}

/* Creates the per-device primary context records (inactive). */
static void primaries_init(void)
{
    td.primary = td_xcalloc((size_t)td.ndevices, sizeof *td.primary);
    td.dev_sticky = td_xcalloc((size_t)td.ndevices, sizeof *td.dev_sticky);
    for (int d = 0; d < td.ndevices; d++) {
        struct td_ctx *c = td_xcalloc(1, sizeof *c);
        td_obj_register(&c->h, TD_OBJ_CTX, c);
        c->dev = d;
        c->primary = true;
        td.primary[d] = c;
    }
}

TD_EXPORT CUresult cuInit(unsigned int Flags)
{
    TD_COUNT(cuInit);
    CUresult rc = td_enter_any();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (Flags != 0)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (!td.initialized) {
        td_config_ensure();
        if (td.ndevices == 0)
            return td_leave(CUDA_ERROR_NO_DEVICE);
        primaries_init();
        td_pools_init();
        td.initialized = true;
        if (td.exit_handler)
            td_exit_handler_install();
    }
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    TD_COUNT(cuDriverGetVersion);
    CUresult rc = td_enter_any();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!driverVersion)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    td_config_ensure();
    *driverVersion = td.version;
    return td_leave(CUDA_SUCCESS);
}

/* Validates a device ordinal (lock held). */
static CUresult dev_check(CUdevice dev)
{
    return dev < 0 || dev >= td.ndevices ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

/* td_enter_args, then dev_check: the front of the device queries. */
static CUresult dev_enter(CUdevice dev, bool args_ok)
{
    CUresult rc = td_enter_args(args_ok);
    if (rc == CUDA_SUCCESS && (rc = dev_check(dev)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

TD_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    TD_COUNT(cuDeviceGet);
    CUresult rc = dev_enter(ordinal, device != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    *device = ordinal;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuDeviceGetCount(int *count)
{
    TD_COUNT(cuDeviceGetCount);
    CUresult rc = td_enter_args(count != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    *count = td.ndevices;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    TD_COUNT(cuDeviceGetName);
    CUresult rc = dev_enter(dev, name && len > 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    snprintf(name, (size_t)len, "cudefer test driver device %d (not a GPU)", dev);
    return td_leave(CUDA_SUCCESS);
}

/* Total device memory of dev into *bytes (lock taken here). */
static CUresult total_mem(size_t *bytes, CUdevice dev)
{
    CUresult rc = dev_enter(dev, bytes != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    *bytes = td.cap_total[td_cap_dev(dev)];
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    TD_COUNT(cuDeviceTotalMem_v2);
    return total_mem(bytes, dev);
}

/* Legacy 32-bit variant: the total is clamped to UINT_MAX. */
TD_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    TD_COUNT(cuDeviceTotalMem);
    size_t b = 0;
    CUresult rc = total_mem(bytes ? &b : NULL, dev);
    if (rc == CUDA_SUCCESS)
        *bytes = b > UINT_MAX ? UINT_MAX : (unsigned)b;
    return rc;
}

/* Attribute values of an H200-like device; unlisted attributes are 0. */
static int attribute_value(CUdevice_attribute a, CUdevice dev)
{
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return INT_MAX;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return INT_MAX;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return (int)TD_SM_COUNT;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x10 + dev;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 6144;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return td.managed_moves;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: return 1;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED: return 1;
    default: return 0;
    }
}

TD_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    TD_COUNT(cuDeviceGetAttribute);
    CUresult rc = dev_enter(dev, pi && (int)attrib > 0 && attrib < CU_DEVICE_ATTRIBUTE_MAX);
    if (rc != CUDA_SUCCESS)
        return rc;
    *pi = attribute_value(attrib, dev);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    TD_COUNT(cuDeviceGetDefaultMemPool);
    CUresult rc = dev_enter(dev, pool_out != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    *pool_out = (CUmemoryPool)td.default_pool[dev];
    return td_leave(CUDA_SUCCESS);
}

/* The private export tables of the real driver (used by the CUDA runtime
 * and NVML) do not exist here. */
TD_EXPORT CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    TD_COUNT(cuGetExportTable);
    (void)pExportTableId;
    if (ppExportTable)
        *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}
