# The ROCm toolchain of the HIP backend and the RCCL collective (-DSHARDLOAD_WITH_HIP=ON):
# hipcc, the HIP headers and the GPU targets the kernels are built for. Sets SL_HIPCC,
# SL_HIP_INCLUDE_DIR, SL_HIP_VERSION, SL_ROCM_ROOT, SL_HIP_LLVM_BIN and SL_HIP_ARCHS_LIST.
#
# Targets: SHARDLOAD_HIP_ARCHS when given (each one is checked: a target this ROCm cannot build
# is an error, never a silent fallback), else those of the current Instinct and Radeon targets
# (SL_HIP_DEFAULT_ARCHS: MI300 gfx942, MI200 gfx90a, RDNA3 gfx1100) that the installed ROCm
# can build, each one tried by compiling a kernel for it; the others are named at configure
# time (Debian 12's ROCm 5.2 builds gfx90a only: its clang-15 does not know gfx942, and its
# device libraries have no gfx1100). hipcc is always given the targets: without one it builds
# for gfx803.

set(SL_HIP_DEFAULT_ARCHS gfx942 gfx90a gfx1100)
set(SL_HIP_ARCH_NAMES "gfx942=MI300, ROCm 6.0 or later" "gfx90a=MI200" "gfx1100=RDNA3, ROCm 5.5 or later")
set(SHARDLOAD_HIP_ARCHS "" CACHE STRING
    "GPU targets of the HIP kernels (e.g. gfx942;gfx90a); empty: those of ${SL_HIP_DEFAULT_ARCHS} this ROCm can build")

set(SL_ROCM_HINTS $ENV{ROCM_PATH} /opt/rocm)
find_program(SL_HIPCC hipcc HINTS ${SL_ROCM_HINTS} PATH_SUFFIXES bin)
if(NOT SL_HIPCC)
  message(FATAL_ERROR "SHARDLOAD_WITH_HIP=ON but hipcc was not found (PATH, $ROCM_PATH/bin, /opt/rocm/bin): install "
                      "ROCm's HIP compiler (Debian 12: `bash scripts/deps.sh --hip`, or apt-get install hipcc "
                      "libamdhip64-dev), or set SL_HIPCC")
endif()
get_filename_component(SL_ROCM_ROOT ${SL_HIPCC} DIRECTORY)
get_filename_component(SL_ROCM_ROOT ${SL_ROCM_ROOT} DIRECTORY)
find_path(SL_HIP_INCLUDE_DIR hip/hip_runtime_api.h HINTS ${SL_ROCM_ROOT}/include ${SL_ROCM_HINTS} PATH_SUFFIXES include)
if(NOT SL_HIP_INCLUDE_DIR)
  message(FATAL_ERROR "SHARDLOAD_WITH_HIP=ON but hip/hip_runtime_api.h was not found (install libamdhip64-dev, or "
                      "ROCm's hip-dev; or set SL_HIP_INCLUDE_DIR)")
endif()
file(STRINGS ${SL_HIP_INCLUDE_DIR}/hip/hip_version.h SL_HIP_VERSION_LINES REGEX "#define HIP_VERSION_(MAJOR|MINOR) ")
string(REGEX REPLACE ".*HIP_VERSION_MAJOR ([0-9]+).*" "\\1" SL_HIP_MAJOR "${SL_HIP_VERSION_LINES}")
string(REGEX REPLACE ".*HIP_VERSION_MINOR ([0-9]+).*" "\\1" SL_HIP_MINOR "${SL_HIP_VERSION_LINES}")
set(SL_HIP_VERSION "${SL_HIP_MAJOR}.${SL_HIP_MINOR}")
# the LLVM that hipcc drives (Debian: clang-15; ROCm: $ROCM/llvm): its objdump and bundler
execute_process(COMMAND ${SL_HIPCC} --version OUTPUT_VARIABLE SL_HIPCC_VERSION ERROR_QUIET)
string(REGEX MATCH "InstalledDir: ([^\n]+)" _dir "${SL_HIPCC_VERSION}")
set(SL_HIP_LLVM_BIN "${CMAKE_MATCH_1}")

# Whether hipcc builds a kernel for ARCH; the compiler's first line of complaint in WHY.
function(sl_hip_try_arch arch ok why)
  set(dir ${CMAKE_BINARY_DIR}/CMakeFiles/sl_hip_arch)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/probe.hip "#include <hip/hip_runtime.h>\n__global__ void sl_probe(float *x) { x[threadIdx.x] += 1.0f; }\n")
  execute_process(COMMAND ${SL_HIPCC} -x hip --offload-arch=${arch} -c ${dir}/probe.hip -o ${dir}/probe-${arch}.o
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  string(REGEX MATCH "error: [^\n;,]*" first "${err}") # one clause: one list item
  string(REGEX REPLACE "^error: " "hipcc: " first "${first}")
  if(rc EQUAL 0)
    set(${ok} TRUE PARENT_SCOPE)
  else()
    set(${ok} FALSE PARENT_SCOPE)
    set(${why} "${first}" PARENT_SCOPE)
  endif()
endfunction()

function(sl_hip_arch_name arch out)
  set(name "${arch}")
  foreach(pair ${SL_HIP_ARCH_NAMES})
    if(pair MATCHES "^${arch}=(.*)$")
      set(name "${arch} (${CMAKE_MATCH_1})")
    endif()
  endforeach()
  set(${out} "${name}" PARENT_SCOPE)
endfunction()

# tried once per hipcc and list (the answer is cached with what it was asked)
set(_asked "2;${SL_HIPCC};${SHARDLOAD_HIP_ARCHS};${SL_HIP_DEFAULT_ARCHS}") # 2: this file's way of asking
if(NOT "${_asked}" STREQUAL "${SL_HIP_ARCHS_ASKED}")
  set(_built)
  set(_refused)
  if(SHARDLOAD_HIP_ARCHS)
    set(_wanted ${SHARDLOAD_HIP_ARCHS})
  else()
    set(_wanted ${SL_HIP_DEFAULT_ARCHS})
  endif()
  foreach(a ${_wanted})
    sl_hip_try_arch(${a} ok why)
    if(ok)
      list(APPEND _built ${a})
    else()
      sl_hip_arch_name(${a} n)
      list(APPEND _refused "${n} (${why})")
    endif()
  endforeach()
  set(SL_HIP_ARCHS_LIST "${_built}" CACHE INTERNAL "the targets the HIP kernels are built for")
  set(SL_HIP_ARCHS_REFUSED "${_refused}" CACHE INTERNAL "the targets this ROCm cannot build, and why")
  set(SL_HIP_ARCHS_ASKED "${_asked}" CACHE INTERNAL "what SL_HIP_ARCHS_LIST answers")
endif()

foreach(r ${SL_HIP_ARCHS_REFUSED})
  if(SHARDLOAD_HIP_ARCHS)
    message(SEND_ERROR "SHARDLOAD_HIP_ARCHS: ROCm ${SL_HIP_VERSION} (${SL_HIPCC}) cannot build ${r}")
  else()
    message(WARNING "SHARDLOAD_WITH_HIP: ROCm ${SL_HIP_VERSION} (${SL_HIPCC}) cannot build ${r}; the HIP kernels are "
                    "built without it, and the module refuses such a device at init. Build against a ROCm that "
                    "can (gfx942: ROCm 6), or name the targets with -DSHARDLOAD_HIP_ARCHS")
  endif()
endforeach()
if(NOT SL_HIP_ARCHS_LIST)
  message(FATAL_ERROR "SHARDLOAD_WITH_HIP: ROCm ${SL_HIP_VERSION} (${SL_HIPCC}) builds none of "
                      "${SHARDLOAD_HIP_ARCHS}${SL_HIP_DEFAULT_ARCHS}; name targets it can build with -DSHARDLOAD_HIP_ARCHS")
endif()
message(STATUS "SHARDLOAD_WITH_HIP: ROCm ${SL_HIP_VERSION} (${SL_HIPCC}), kernels for ${SL_HIP_ARCHS_LIST}")
