# cmake -DIN=<module.ll> -DOUT=<host.ll> -P spirv_to_host.cmake
# A SPIR-V module translated back to LLVM IR (llvm-spirv -r, llvm-dis), made compilable for
# this host, for test_ze_spirv_run: the spir64 triple and data layout go (the host compiler's
# own apply),
# the SPIR calling conventions to C's, OpenCL's global address space to the default one (the
# test's buffers are host memory). Nothing else changes: the instructions are the module's.
file(READ "${IN}" ir)
string(REGEX REPLACE "target datalayout = \"[^\"]*\"\n" "" ir "${ir}")
string(REGEX REPLACE "target triple = \"[^\"]*\"\n" "" ir "${ir}")
string(REPLACE "spir_kernel " "" ir "${ir}")
string(REPLACE "spir_func " "" ir "${ir}")
string(REGEX REPLACE " addrspace\\([0-9]+\\)" "" ir "${ir}")
file(WRITE "${OUT}.tmp" "${ir}")
file(RENAME "${OUT}.tmp" "${OUT}")
