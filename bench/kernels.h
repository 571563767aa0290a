/* kernels.h - the GPU kernels of the demonstration, the benchmarks and the
 * GPU checks, as PTX text that the driver compiles at cuModuleLoadData, so
 * that nothing here needs nvcc.
 *
 *   cudefer_spin(u64 ns, u64 buf, u64 words)
 *       runs for ns nanoseconds (by %globaltimer); when buf is not 0 it
 *       keeps writing buf[i % words] (u32) meanwhile, so a buffer freed
 *       under it faults with CUDA_ERROR_ILLEGAL_ADDRESS.
 *   cudefer_wait_flag(u64 flag)
 *       spins until the u32 at flag (host memory mapped for the device)
 *       is not 0: the kernel that waits for the host.
 *   cudefer_touch(u64 buf, u64 words)
 *       writes buf[0 .. words) once (words capped by the caller).
 *   cudefer_fill(u64 buf, u64 words)
 *       every thread of the grid writes its share of buf[0 .. words) once
 *       (a grid-stride loop): touches every byte of a large block.
 *
 * cudefer_touch and cudefer_spin run as one thread each.
 */
#ifndef CUDEFER_BENCH_KERNELS_H
#define CUDEFER_BENCH_KERNELS_H

static const char cudefer_kernels_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry cudefer_spin(.param .u64 ns, .param .u64 buf, .param .u64 words)\n"
    "{\n"
    "    .reg .pred %p<3>;\n"
    "    .reg .b32 %r<2>;\n"
    "    .reg .b64 %rd<12>;\n"
    "    ld.param.u64 %rd1, [ns];\n"
    "    ld.param.u64 %rd2, [buf];\n"
    "    ld.param.u64 %rd3, [words];\n"
    "    mov.u64 %rd4, %globaltimer;\n"
    "    mov.u64 %rd5, 0;\n"
    "    setp.eq.u64 %p1, %rd3, 0;\n"
    "    @%p1 mov.u64 %rd2, 0;\n"
    "LOOP:\n"
    "    setp.eq.u64 %p2, %rd2, 0;\n"
    "    @%p2 bra.uni TIME;\n"
    "    rem.u64 %rd6, %rd5, %rd3;\n"
    "    shl.b64 %rd7, %rd6, 2;\n"
    "    add.u64 %rd8, %rd2, %rd7;\n"
    "    cvt.u32.u64 %r1, %rd5;\n"
    "    st.volatile.global.u32 [%rd8], %r1;\n"
    "    add.u64 %rd5, %rd5, 1;\n"
    "TIME:\n"
    "    mov.u64 %rd9, %globaltimer;\n"
    "    sub.u64 %rd10, %rd9, %rd4;\n"
    "    setp.lt.u64 %p2, %rd10, %rd1;\n"
    "    @%p2 bra.uni LOOP;\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry cudefer_wait_flag(.param .u64 flag)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<2>;\n"
    "    .reg .b64 %rd<2>;\n"
    "    ld.param.u64 %rd1, [flag];\n"
    "WAIT:\n"
    "    ld.volatile.global.u32 %r1, [%rd1];\n"
    "    setp.eq.u32 %p1, %r1, 0;\n"
    "    @%p1 bra.uni WAIT;\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry cudefer_touch(.param .u64 buf, .param .u64 words)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<2>;\n"
    "    .reg .b64 %rd<6>;\n"
    "    ld.param.u64 %rd1, [buf];\n"
    "    ld.param.u64 %rd2, [words];\n"
    "    mov.u64 %rd3, 0;\n"
    "    setp.eq.u64 %p1, %rd2, 0;\n"
    "    @%p1 bra.uni DONE;\n"
    "NEXT:\n"
    "    shl.b64 %rd4, %rd3, 2;\n"
    "    add.u64 %rd5, %rd1, %rd4;\n"
    "    cvt.u32.u64 %r1, %rd3;\n"
    "    st.global.u32 [%rd5], %r1;\n"
    "    add.u64 %rd3, %rd3, 1;\n"
    "    setp.lt.u64 %p1, %rd3, %rd2;\n"
    "    @%p1 bra.uni NEXT;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry cudefer_fill(.param .u64 buf, .param .u64 words)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<6>;\n"
    "    .reg .b64 %rd<8>;\n"
    "    ld.param.u64 %rd1, [buf];\n"
    "    ld.param.u64 %rd2, [words];\n"
    "    mov.u32 %r1, %ctaid.x;\n"
    "    mov.u32 %r2, %ntid.x;\n"
    "    mov.u32 %r3, %tid.x;\n"
    "    mov.u32 %r4, %nctaid.x;\n"
    "    mul.wide.u32 %rd3, %r1, %r2;\n"
    "    cvt.u64.u32 %rd4, %r3;\n"
    "    add.u64 %rd3, %rd3, %rd4;\n"
    "    mul.wide.u32 %rd5, %r4, %r2;\n"
    "FILL:\n"
    "    setp.ge.u64 %p1, %rd3, %rd2;\n"
    "    @%p1 bra.uni END;\n"
    "    shl.b64 %rd6, %rd3, 2;\n"
    "    add.u64 %rd7, %rd1, %rd6;\n"
    "    cvt.u32.u64 %r5, %rd3;\n"
    "    st.global.u32 [%rd7], %r5;\n"
    "    add.u64 %rd3, %rd3, %rd5;\n"
    "    bra.uni FILL;\n"
    "END:\n"
    "    ret;\n"
    "}\n";

#endif
