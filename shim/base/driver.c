/* driver.c - finding glibc's dlsym, opening the real driver and looking up
 * its entry points. */
#include "driver.h"

#include "log.h"
#include "options.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- glibc's dlsym ----------------------------------------------------- */

/* Every version glibc has given dlsym: GLIBC_2.34 on every architecture
 * since dlsym moved into libc, and before that each port's base version. */
static const char *const dlsym_versions[] = {
    "GLIBC_2.34",
    "GLIBC_2.2.5", /* x86_64 */
    "GLIBC_2.17",  /* aarch64, ppc64le */
    "GLIBC_2.0",   /* i386, mips, 32-bit powerpc and sparc, m68k, sh, alpha */
    "GLIBC_2.2",   /* s390x, sparc64, ia64, hppa */
    "GLIBC_2.3",   /* ppc64 (big-endian) */
    "GLIBC_2.4",   /* arm */
    "GLIBC_2.16",  /* x32 */
    "GLIBC_2.18",  /* microblaze */
    "GLIBC_2.21",  /* nios2 */
    "GLIBC_2.27",  /* riscv64 */
    "GLIBC_2.29",  /* csky */
    "GLIBC_2.32",  /* arc */
    "GLIBC_2.33",  /* riscv32 */
    "GLIBC_2.35",  /* or1k */
    "GLIBC_2.36",  /* loongarch64 */
    NULL,
};

/* A dynamic-section address: glibc relocates some entries in place and
 * not others, and on some architectures none. */
static uintptr_t dyn_addr(uintptr_t base, ElfW(Addr) p)
{
    return p < base ? base + p : p;
}

static bool object_holds(const struct dl_phdr_info *info, uintptr_t addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && addr >= lo && addr < lo + ph->p_memsz)
            return true;
    }
    return false;
}

struct elf_tables {
    const ElfW(Sym) *symtab;
    const char *strtab;
    const uint32_t *gnu_hash;
    const uint32_t *hash;
    const ElfW(Half) *versym;
};

/* The tables of the object loaded at base whose dynamic section is dyn. */
static bool tables_of(uintptr_t base, const ElfW(Dyn) *d, struct elf_tables *t)
{
    memset(t, 0, sizeof *t);
    for (; d && d->d_tag != DT_NULL; d++) {
        uintptr_t p = dyn_addr(base, d->d_un.d_ptr);
        switch (d->d_tag) {
        case DT_SYMTAB: t->symtab = (const ElfW(Sym) *)p; break;
        case DT_STRTAB: t->strtab = (const char *)p; break;
        case DT_GNU_HASH: t->gnu_hash = (const uint32_t *)p; break;
        case DT_HASH: t->hash = (const uint32_t *)p; break;
        case DT_VERSYM: t->versym = (const ElfW(Half) *)p; break;
        default: break;
        }
    }
    return t->symtab && t->strtab && (t->gnu_hash || t->hash);
}

static bool read_tables(const struct dl_phdr_info *info, struct elf_tables *t)
{
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            return tables_of(info->dlpi_addr,
                             (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr), t);
    return false;
}

/* Whether symbol i is a defined function named name; *preferred when it is
 * the default version (not hidden). */
static bool symbol_matches(const struct elf_tables *t, uint32_t i, const char *name,
                           bool *preferred)
{
    const ElfW(Sym) *s = &t->symtab[i];
    if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC ||
        strcmp(t->strtab + s->st_name, name) != 0)
        return false;
    *preferred = !t->versym || !(t->versym[i] & 0x8000);
    return true;
}

/* Any defined symbol named name (functions and data), for the lookups made
 * without glibc's dlsym. */
static bool defined_as(const struct elf_tables *t, uint32_t i, const char *name, bool *preferred)
{
    const ElfW(Sym) *s = &t->symtab[i];
    if (s->st_shndx == SHN_UNDEF || strcmp(t->strtab + s->st_name, name) != 0)
        return false;
    *preferred = !t->versym || !(t->versym[i] & 0x8000);
    return true;
}

static uint32_t gnu_hash_of(const char *name)
{
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = h * 33 + *c;
    return h;
}

static uint32_t elf_hash_of(const char *name)
{
    uint32_t h = 0;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        h = (h << 4) + *c;
        uint32_t g = h & 0xf0000000u;
        if (g)
            h ^= g >> 24;
        h &= ~g;
    }
    return h;
}

typedef bool (*symbol_test)(const struct elf_tables *t, uint32_t i, const char *name,
                            bool *preferred);

/* The index of name in the object's dynamic symbols, the default version
 * first; 0 when it has none that passes test. */
static uint32_t find_symbol(const struct elf_tables *t, const char *name, symbol_test test)
{
    uint32_t found = 0;
    bool preferred = false;
    if (t->gnu_hash) {
        uint32_t nbuckets = t->gnu_hash[0], symoffset = t->gnu_hash[1];
        uint32_t bloom_size = t->gnu_hash[2];
        const uint32_t *buckets =
            (const uint32_t *)((const ElfW(Addr) *)&t->gnu_hash[4] + bloom_size);
        const uint32_t *chain = buckets + nbuckets;
        uint32_t h = gnu_hash_of(name);
        for (uint32_t i = buckets[h % nbuckets]; i >= symoffset && i; i++) {
            uint32_t h2 = chain[i - symoffset];
            if ((h | 1) == (h2 | 1) && test(t, i, name, &preferred) &&
                (!found || preferred))
                found = i;
            if (h2 & 1)
                break;
        }
        return found;
    }
    uint32_t nbucket = t->hash[0];
    const uint32_t *bucket = &t->hash[2], *chain = bucket + nbucket;
    for (uint32_t i = bucket[elf_hash_of(name) % nbucket]; i; i = chain[i])
        if (test(t, i, name, &preferred) && (!found || preferred))
            found = i;
    return found;
}

struct dlsym_search {
    uintptr_t self;   /* an address inside cudefer */
    bool passed_self; /* objects after cudefer come first, as for RTLD_NEXT */
    void *after;      /* dlsym of the first object after cudefer */
    void *before;     /* of the first one before it */
};

static int search_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct dlsym_search *s = data;
    struct elf_tables t;
    if (object_holds(info, s->self)) {
        s->passed_self = true;
        return 0;
    }
    if (!read_tables(info, &t))
        return 0;
    uint32_t i = find_symbol(&t, "dlsym", symbol_matches);
    if (!i)
        return 0;
    void *fn = (void *)(info->dlpi_addr + t.symtab[i].st_value);
    if (s->passed_self && !s->after)
        s->after = fn;
    else if (!s->passed_self && !s->before)
        s->before = fn;
    return s->after != NULL;
}

/* The dlsym defined by a library loaded after cudefer (else before it), read
 * from the libraries' dynamic symbol tables. */
static cd_dlsym_fn dlsym_from_tables(void)
{
    struct dlsym_search s = {(uintptr_t)&dlsym_from_tables, false, NULL, NULL};
    dl_iterate_phdr(search_object, &s);
    void *fn = s.after ? s.after : s.before;
    cd_dlsym_fn out;
    memcpy(&out, &fn, sizeof out);
    return out;
}

/* Called from the dlsym override, possibly before a sanitizer runtime has
 * finished starting (it looks its own functions up with dlsym): not
 * instrumented. */
__attribute__((no_sanitize_thread, no_sanitize_address)) static cd_dlsym_fn find_real_dlsym(void)
{
    for (const char *const *v = dlsym_versions; *v; v++) {
        void *fn = dlvsym(RTLD_NEXT, "dlsym", *v);
        if (fn) {
            cd_dlsym_fn out;
            memcpy(&out, &fn, sizeof out);
            return out;
        }
    }
    return dlsym_from_tables();
}

/* Without glibc's dlsym: name in the object of link map lm, or NULL. */
static void *lookup_in(const struct link_map *lm, const char *name)
{
    struct elf_tables t;
    if (!lm || !tables_of(lm->l_addr, lm->l_ld, &t))
        return NULL;
    uint32_t i = find_symbol(&t, name, defined_as);
    return i ? (void *)(lm->l_addr + t.symtab[i].st_value) : NULL;
}

/* Without glibc's dlsym: name in handle's object or one loaded after it
 * (RTLD_DEFAULT: from the program; RTLD_NEXT: after caller's object). */
static void *lookup_without_dlsym(void *handle, const char *name, const void *caller)
{
    struct link_map *lm = NULL;
    if (handle == RTLD_NEXT) {
        Dl_info info;
        if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
            return NULL;
        lm = lm->l_next;
    } else {
        void *h = handle == RTLD_DEFAULT ? dlopen(NULL, RTLD_LAZY | RTLD_NOLOAD) : handle;
        if (!h || dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0)
            return NULL;
    }
    for (; lm; lm = lm->l_next) {
        void *fn = lookup_in(lm, name);
        if (fn)
            return fn;
    }
    return NULL;
}

static _Atomic bool no_dlsym;

__attribute__((no_sanitize_thread, no_sanitize_address)) cd_dlsym_fn cd_real_dlsym_fn(void)
{
    static _Atomic(cd_dlsym_fn) real;
    cd_dlsym_fn fn = atomic_load_explicit(&real, memory_order_acquire);
    if (fn)
        return fn;
    fn = find_real_dlsym();
    if (fn) {
        atomic_store_explicit(&real, fn, memory_order_release);
        return fn;
    }
    if (!atomic_exchange(&no_dlsym, true))
        cd_log_raw("cudefer: error: glibc's dlsym cannot be found (neither by symbol version "
                   "nor in the loaded libraries): cudefer is disabled, and dlsym reads the "
                   "libraries' symbol tables itself\n");
    return NULL;
}

void *cd_real_dlsym(void *handle, const char *name)
{
    cd_dlsym_fn fn = cd_real_dlsym_fn();
    return fn ? fn(handle, name) : lookup_without_dlsym(handle, name, NULL);
}

void *cd_fallback_dlsym(void *handle, const char *name, const void *caller)
{
    return lookup_without_dlsym(handle, name, caller);
}

/* ---- the driver -------------------------------------------------------- */

static _Atomic(void *) driver;
static _Atomic bool two_drivers;

static void *open_driver(void)
{
    const char *path = cd_option_str(CD_OPT_DRIVER);
    bool chosen = *path != '\0';
    if (!chosen)
        path = "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        cd_log(CD_LOG_ERROR, "cannot open the CUDA driver %s: %s", path, dlerror());
        return NULL;
    }
    if (!chosen)
        return h;
    /* The program's own driver, if it has loaded one: calls that reach it
     * without cudefer would meet a driver that cudefer's calls never
     * initialised. cudefer steps aside and forwards to the program's. */
    void *own = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!own || own == h) {
        if (own)
            dlclose(own);
        return h;
    }
    atomic_store(&two_drivers, true);
    cd_log(CD_LOG_ERROR, "CUDEFER_DRIVER names %s, but the program has loaded another "
           "libcuda.so.1: two drivers in one process cannot work, so cudefer passes every "
           "call to the program's driver unchanged", path);
    dlclose(h);
    return own;
}

void *cd_driver_handle(void)
{
    void *h = atomic_load_explicit(&driver, memory_order_acquire);
    if (h)
        return h;
    /* No lock is held here: two threads may both open the driver, which
     * only raises its reference count. */
    h = open_driver();
    if (!h)
        return NULL;
    void *expected = NULL;
    if (!atomic_compare_exchange_strong(&driver, &expected, h)) {
        dlclose(h);
        h = expected;
    }
    return h;
}

bool cd_driver_is_foreign(void *handle)
{
    void *ours = cd_driver_handle();
    if (!handle || handle == ours || handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return false;
    struct link_map *lm = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name)
        return false;
    const char *base = strrchr(lm->l_name, '/');
    base = base ? base + 1 : lm->l_name;
    if (strcmp(base, "libcuda.so.1") != 0)
        return false;
    if (!atomic_exchange(&two_drivers, true))
        cd_log(CD_LOG_ERROR, "the program looks functions up in %s, which is not the driver "
               "cudefer calls: cudefer passes its calls through unchanged", lm->l_name);
    return true;
}

void *cd_driver_sym(const char *name)
{
    void *h = cd_driver_handle();
    return h ? cd_real_dlsym(h, name) : NULL;
}

/* ---- the engine's entry points ------------------------------------------- */

struct op_name {
    size_t offset;
    const char *name;
    bool optional;
};

#define OP(field, sym, opt) {offsetof(struct cd_driver_ops, field), sym, opt}
static const struct op_name op_names[] = {
    OP(driver_get_version, "cuDriverGetVersion", false),
    OP(ctx_get_current, "cuCtxGetCurrent", false),
    OP(ctx_get_device, "cuCtxGetDevice", false),
    OP(device_get_attribute, "cuDeviceGetAttribute", false),
    OP(ctx_get_api_version, "cuCtxGetApiVersion", false),
    OP(ctx_push, "cuCtxPushCurrent_v2", false),
    OP(ctx_pop, "cuCtxPopCurrent_v2", false),
    OP(ctx_record_event, "cuCtxRecordEvent", true),
    OP(ctx_from_green, "cuCtxFromGreenCtx", true),
    OP(primary_get_state, "cuDevicePrimaryCtxGetState", false),
    OP(primary_retain, "cuDevicePrimaryCtxRetain", false),
    OP(primary_release, "cuDevicePrimaryCtxRelease_v2", false),
    OP(stream_create, "cuStreamCreate", false),
    OP(stream_destroy, "cuStreamDestroy_v2", false),
    OP(stream_get_ctx, "cuStreamGetCtx", false),
    OP(stream_wait_event, "cuStreamWaitEvent", false),
    OP(stream_synchronize, "cuStreamSynchronize", false),
    OP(stream_is_capturing, "cuStreamIsCapturing", true),
    OP(event_create, "cuEventCreate", false),
    OP(event_destroy, "cuEventDestroy_v2", false),
    OP(event_record, "cuEventRecord", false),
    OP(event_query, "cuEventQuery", false),
    OP(event_synchronize, "cuEventSynchronize", false),
    OP(mem_alloc, "cuMemAlloc_v2", false),
    OP(mem_free_async, "cuMemFreeAsync", false),
    OP(mem_host_alloc, "cuMemHostAlloc", true),
    OP(host_device_pointer, "cuMemHostGetDevicePointer_v2", true),
    OP(stream_write_value32, "cuStreamWriteValue32_v2", true),
    OP(exchange_capture_mode, "cuThreadExchangeStreamCaptureMode", false),
    OP(pointer_get_attribute, "cuPointerGetAttribute", true),
    OP(mem_free, "cuMemFree_v2", false),
    OP(mem_free_host, "cuMemFreeHost", false),
    OP(mem_host_unregister, "cuMemHostUnregister", false),
    OP(array_destroy, "cuArrayDestroy", false),
    OP(mipmapped_array_destroy, "cuMipmappedArrayDestroy", false),
    OP(module_unload, "cuModuleUnload", false),
    OP(library_unload, "cuLibraryUnload", true),
};
#undef OP

static struct cd_driver_ops ops;
enum { OPS_UNRESOLVED, OPS_READY, OPS_UNUSABLE, OPS_RESOLVING };
static _Atomic int ops_state;
static _Atomic int version;

static int resolve_ops(void)
{
    if (!cd_driver_handle())
        return OPS_UNRESOLVED; /* retried on a later call */
    if (atomic_load(&two_drivers))
        return OPS_UNUSABLE;
    for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++) {
        void *fn = cd_driver_sym(op_names[i].name);
        if (!fn && !op_names[i].optional) {
            cd_log(CD_LOG_ERROR, "the CUDA driver lacks %s: releases pass through unchanged",
                   op_names[i].name);
            return OPS_UNUSABLE;
        }
        memcpy((char *)&ops + op_names[i].offset, &fn, sizeof fn);
    }
    int v = 0;
    if (ops.driver_get_version(&v) == CUDA_SUCCESS)
        atomic_store(&version, v);
    return OPS_READY;
}

const struct cd_driver_ops *cd_driver_ops(void)
{
    for (;;) {
        int state = atomic_load_explicit(&ops_state, memory_order_acquire);
        if (state == OPS_READY)
            return atomic_load(&two_drivers) ? NULL : &ops;
        if (state == OPS_UNUSABLE)
            return NULL;
        if (state == OPS_RESOLVING) {
            /* Another thread is looking names up; that takes microseconds
             * and never waits for this one. */
            sched_yield();
            continue;
        }
        if (!atomic_compare_exchange_weak(&ops_state, &state, OPS_RESOLVING))
            continue;
        state = resolve_ops();
        atomic_store_explicit(&ops_state, state, memory_order_release);
        if (state == OPS_UNRESOLVED)
            return NULL;
    }
}

int cd_driver_version(void)
{
    cd_driver_ops();
    return atomic_load(&version);
}

bool cd_driver_records_contexts(void)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    return ops && cd_driver_version() >= 12050 && ops->ctx_record_event;
}

static _Atomic bool stopped;

bool cd_driver_in_use(void)
{
    return !atomic_load_explicit(&stopped, memory_order_relaxed) && cd_real_dlsym_fn() &&
           cd_driver_ops();
}

void cd_driver_stop_using(void)
{
    atomic_store(&stopped, true);
}
