# The tools that build the Level Zero backend's kernels (backends/level_zero/kernels.cl) to
# SPIR-V at build time, included with -DSHARDLOAD_WITH_LEVEL_ZERO=ON. Debian packages, so CI and
# any developer machine have them without a vendor SDK:
#   SL_SPIRV_CLANG     clang 15 (OpenCL C for -target spir64 to LLVM IR)        clang-15
#   SL_LLVM_SPIRV      the Khronos LLVM/SPIR-V translator of the same LLVM      llvm-spirv-15
#   SL_SPIRV_VAL       spirv-val (every module is validated as it is built)     spirv-tools
#   SL_SPIRV_DIS       spirv-dis (test_ze_spirv reads the kernels' SPIR-V)      spirv-tools
#   SL_LLVM_DIS        llvm-dis of the same LLVM (optional: test_ze_spirv_run   llvm-15
#                      runs the modules translated back; not registered without)
# Each may be given as a cache variable (-DSL_SPIRV_CLANG=/path/clang). LLVM IR is read only by
# the translator of its own LLVM version, so the clang and llvm-spirv pair must match: both 15
# unless both are overridden.
include_guard(GLOBAL)

find_program(SL_SPIRV_CLANG NAMES clang-15 HINTS /usr/lib/llvm-15/bin)
find_program(SL_LLVM_SPIRV NAMES llvm-spirv-15 HINTS /usr/lib/llvm-15/bin)
find_program(SL_SPIRV_VAL NAMES spirv-val)
find_program(SL_SPIRV_DIS NAMES spirv-dis)
find_program(SL_LLVM_DIS NAMES llvm-dis-15 HINTS /usr/lib/llvm-15/bin)

# A tool is missing when it was not found, or was given as a path that is not there.
set(sl_missing)
if(NOT SL_SPIRV_CLANG OR NOT EXISTS "${SL_SPIRV_CLANG}")
  list(APPEND sl_missing "clang-15 (apt-get install clang-15; SL_SPIRV_CLANG='${SL_SPIRV_CLANG}')")
endif()
if(NOT SL_LLVM_SPIRV OR NOT EXISTS "${SL_LLVM_SPIRV}")
  list(APPEND sl_missing "llvm-spirv-15 (apt-get install llvm-spirv-15; SL_LLVM_SPIRV='${SL_LLVM_SPIRV}')")
endif()
if(NOT SL_SPIRV_VAL OR NOT EXISTS "${SL_SPIRV_VAL}" OR NOT SL_SPIRV_DIS OR NOT EXISTS "${SL_SPIRV_DIS}")
  list(APPEND sl_missing "spirv-val and spirv-dis (apt-get install spirv-tools; SL_SPIRV_VAL='${SL_SPIRV_VAL}', "
                         "SL_SPIRV_DIS='${SL_SPIRV_DIS}')")
endif()
if(sl_missing)
  list(JOIN sl_missing "; " sl_missing_text)
  message(FATAL_ERROR "SHARDLOAD_WITH_LEVEL_ZERO=ON builds the backend's kernels to SPIR-V, and this machine lacks: "
                      "${sl_missing_text}. Install them, point SL_SPIRV_CLANG/SL_LLVM_SPIRV/SL_SPIRV_VAL/SL_SPIRV_DIS "
                      "at them, or configure with -DSHARDLOAD_WITH_LEVEL_ZERO=OFF")
endif()

# clang must target spir64 (a clang built without the SPIR target cannot)
execute_process(COMMAND ${SL_SPIRV_CLANG} -cl-std=CL2.0 -target spir64 -x cl -fsyntax-only -
                INPUT_FILE /dev/null RESULT_VARIABLE sl_rc ERROR_VARIABLE sl_err)
if(NOT sl_rc EQUAL 0)
  message(FATAL_ERROR "SHARDLOAD_WITH_LEVEL_ZERO=ON: ${SL_SPIRV_CLANG} cannot compile OpenCL C for -target spir64 "
                      "(${sl_err}); install Debian's clang-15 or set SL_SPIRV_CLANG to a clang that can")
endif()
# the translator reads only the bitcode of its own LLVM major version
execute_process(COMMAND ${SL_SPIRV_CLANG} --version OUTPUT_VARIABLE sl_clang_v ERROR_QUIET)
execute_process(COMMAND ${SL_LLVM_SPIRV} --version OUTPUT_VARIABLE sl_spirv_v ERROR_QUIET)
string(REGEX MATCH "clang version ([0-9]+)" _ "${sl_clang_v}")
set(sl_clang_major "${CMAKE_MATCH_1}")
string(REGEX MATCH "LLVM version ([0-9]+)" _ "${sl_spirv_v}")
set(sl_spirv_major "${CMAKE_MATCH_1}")
if(NOT sl_clang_major OR NOT sl_clang_major STREQUAL sl_spirv_major)
  message(FATAL_ERROR "SHARDLOAD_WITH_LEVEL_ZERO=ON: ${SL_SPIRV_CLANG} is clang '${sl_clang_major}' but ${SL_LLVM_SPIRV} "
                      "translates LLVM '${sl_spirv_major}': use a clang and llvm-spirv of one LLVM version "
                      "(Debian's clang-15 and llvm-spirv-15)")
endif()
message(STATUS "Level Zero kernels: ${SL_SPIRV_CLANG} -> ${SL_LLVM_SPIRV} -> ${SL_SPIRV_VAL}")
