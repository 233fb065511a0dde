# The Level Zero backend's kernels: kernels.cl, the element math of the CUDA and HIP
# kernels (backends/cuda/cuda_convert.h) through kernels_map.h, built at compile time into two
# SPIR-V modules (ze_kernels.h names their kernels), validated by spirv-val as they are built and
# embedded into C (ze_spirv.h) for the module:
#   sl_ze_spirv          OBJECT library: sl__ze_spirv_base and sl__ze_spirv_f64 (PIC)
#   sl_ze_host_kernels   OBJECT library: the same kernels as host C, by name, and a reader of
#                        a SPIR-V module's kernels (kernels_host.h),
#                        for the Level Zero test driver (PIC; tests only, never installed;
#                        it needs libc only)
# and the tests: test_ze_kernels (the host build against sl_convert and the host SGD step),
# test_ze_spirv_run (the same checks on the SPIR-V modules themselves, translated back and
# compiled for the host) and test_ze_spirv (the SPIR-V text: entry points, no FMA,
# ContractionOff, Float64 in the F64 module only).
# Included by backends/level_zero/CMakeLists.txt; cmake/SpirvToolchain.cmake found the tools.

set(SL_ZE_SRC ${CMAKE_CURRENT_LIST_DIR})
set(SL_ZE_SPIRV_DIR ${CMAKE_CURRENT_BINARY_DIR}/spirv)

# sl_ze_spirv_module(OUT <spv> MODULE <0|1> CONTRACT <off|on>): kernels.cl -> SPIR-V.
#  - OpenCL C 2.0 for spir64; the base module (0) with cl_khr_fp64 off, so that nothing in it
#    can use double and it declares no Float64;
#  - contraction off in clang and in the translator (each entry point ContractionOff: the device
#    compiler may not fuse either); CONTRACT on is OpenCL's default, built only for the check
#    that must find its mads (test_ze_spirv);
#  - no loop or SLP vectoriser: its reduction intrinsics have no SPIR-V translation, and the
#    device compiler vectorises across work-items anyway;
#  - SPIR-V 1.0 at most 1.2 (what Level Zero drivers take), validated for the OpenCL 2.0
#    environment.
function(sl_ze_spirv_module out module contract)
  set(ext)
  if(module EQUAL 0)
    set(ext -Xclang -cl-ext=-cl_khr_fp64)
  endif()
  get_filename_component(dir ${out} DIRECTORY)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
    COMMAND ${SL_SPIRV_CLANG} -cl-std=CL2.0 -target spir64 -O2 -fno-vectorize -fno-slp-vectorize
            -ffp-contract=${contract} -Wall -Wextra -Werror ${ext} -DSL_ZE_MODULE=${module}
            -I${SL_ZE_SRC} -I${PROJECT_SOURCE_DIR}/backends/cuda -MD -MF ${out}.d
            -emit-llvm -c ${SL_ZE_SRC}/kernels.cl -o ${out}.bc
    COMMAND ${SL_LLVM_SPIRV} --spirv-max-version=1.2 --spirv-fp-contract=${contract} ${out}.bc -o ${out}
    COMMAND ${SL_SPIRV_VAL} --target-env opencl2.0 ${out}
    DEPFILE ${out}.d
    DEPENDS ${SL_ZE_SRC}/kernels.cl
    COMMENT "SPIR-V: kernels.cl module ${module} (-ffp-contract=${contract})"
    VERBATIM)
endfunction()

set(SL_ZE_SPIRV_FILES)
set(SL_ZE_SPIRV_C)
foreach(m base f64)
  if(m STREQUAL base)
    set(id 0)
  else()
    set(id 1)
  endif()
  set(spv ${SL_ZE_SPIRV_DIR}/kernels_${m}.spv)
  set(c ${SL_ZE_SPIRV_DIR}/ze_spirv_${m}.c)
  sl_ze_spirv_module(${spv} ${id} off)
  add_custom_command(OUTPUT ${c}
                     COMMAND ${CMAKE_COMMAND} -DIN=${spv} -DOUT=${c} -DNAME=sl__ze_spirv_${m}
                             -P ${SL_ZE_SRC}/embed_spirv.cmake
                     DEPENDS ${spv} ${SL_ZE_SRC}/embed_spirv.cmake
                     COMMENT "SPIR-V: embedding kernels_${m}.spv" VERBATIM)
  list(APPEND SL_ZE_SPIRV_FILES ${spv})
  list(APPEND SL_ZE_SPIRV_C ${c})
endforeach()

add_library(sl_ze_spirv OBJECT ${SL_ZE_SPIRV_C})
set_target_properties(sl_ze_spirv PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(sl_ze_spirv PUBLIC ${SL_ZE_SRC})

# The host build: the same source with the same contraction rule as the device's.
add_library(sl_ze_host_kernels OBJECT ${SL_ZE_SRC}/kernels_host.c ${SL_ZE_SRC}/spirv_scan.c)
set_target_properties(sl_ze_host_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(sl_ze_host_kernels PUBLIC ${SL_ZE_SRC} ${PROJECT_SOURCE_DIR}/backends/cuda
                           ${PROJECT_SOURCE_DIR}/core/include ${PROJECT_BINARY_DIR}/include)
target_compile_options(sl_ze_host_kernels PRIVATE ${SL_WARNINGS} -Werror -fno-strict-aliasing -ffp-contract=off)
set_source_files_properties(${SL_ZE_SRC}/kernels_host.c PROPERTIES OBJECT_DEPENDS ${SL_ZE_SRC}/kernels.cl)

if(NOT SHARDLOAD_BUILD_TESTS)
  return()
endif()

# The host build of every kernel, by name, against sl_convert (every 16-bit pattern, millions
# of F32/F64 values, aligned and byte-offset buffers, several grid sizes) and the host SGD step;
# and the embedded modules against the files spirv-val passed.
sl_add_test(test_ze_kernels SOURCES ${SL_ZE_SRC}/test_ze_kernels.c $<TARGET_OBJECTS:sl_ze_host_kernels>
            $<TARGET_OBJECTS:sl_ze_spirv> LABELS "unit;level_zero" TIMEOUT 600 ARGS ${SL_ZE_SPIRV_FILES})
target_include_directories(test_ze_kernels PRIVATE ${SL_ZE_SRC} ${PROJECT_SOURCE_DIR}/backends/cuda
                           ${PROJECT_SOURCE_DIR}/core/src)

# The same checks on the SPIR-V modules themselves: each translated back to LLVM IR, retargeted
# to this host (spirv_to_host.cmake) and compiled by clang, with the OpenCL built-ins and the
# by-name table of spirv_run.c.
if(SL_LLVM_DIS)
  set(SL_ZE_SPIRV_HOST_OBJS)
  foreach(spv ${SL_ZE_SPIRV_FILES})
    get_filename_component(stem ${spv} NAME_WE)
    set(rt ${SL_ZE_SPIRV_DIR}/host/${stem})
    add_custom_command(
      OUTPUT ${rt}.o
      COMMAND ${CMAKE_COMMAND} -E make_directory ${SL_ZE_SPIRV_DIR}/host
      COMMAND ${SL_LLVM_SPIRV} -r ${spv} -o ${rt}.bc
      COMMAND ${SL_LLVM_DIS} ${rt}.bc -o ${rt}.spir.ll
      COMMAND ${CMAKE_COMMAND} -DIN=${rt}.spir.ll -DOUT=${rt}.ll -P ${SL_ZE_SRC}/spirv_to_host.cmake
      COMMAND ${SL_SPIRV_CLANG} -O2 -fPIC -Wno-override-module -c ${rt}.ll -o ${rt}.o
      DEPENDS ${spv} ${SL_ZE_SRC}/spirv_to_host.cmake
      COMMENT "SPIR-V: ${stem}.spv translated back and compiled for the host" VERBATIM)
    list(APPEND SL_ZE_SPIRV_HOST_OBJS ${rt}.o)
  endforeach()
  set_source_files_properties(${SL_ZE_SPIRV_HOST_OBJS} PROPERTIES EXTERNAL_OBJECT ON GENERATED ON)
  sl_add_test(test_ze_spirv_run SOURCES ${SL_ZE_SRC}/test_ze_kernels.c ${SL_ZE_SRC}/spirv_run.c ${SL_ZE_SRC}/spirv_scan.c
              ${SL_ZE_SPIRV_HOST_OBJS} $<TARGET_OBJECTS:sl_ze_spirv> LABELS "unit;level_zero" TIMEOUT 600
              ARGS ${SL_ZE_SPIRV_FILES})
  target_include_directories(test_ze_spirv_run PRIVATE ${SL_ZE_SRC} ${PROJECT_SOURCE_DIR}/backends/cuda
                             ${PROJECT_SOURCE_DIR}/core/src)
  target_link_libraries(test_ze_spirv_run PRIVATE m)
else()
  message(WARNING "SHARDLOAD_WITH_LEVEL_ZERO: no llvm-dis-15 (apt-get install llvm-15): test_ze_spirv_run (the "
                  "SPIR-V modules themselves run on the host against sl_convert) is not registered")
endif()

# The SPIR-V (spirv-dis): each module's entry points are exactly the kernels ze_kernels.h gives
# it, each ContractionOff, no fma/mad; Float64 in the F64 module only. The same check on the
# modules built with OpenCL's default contraction must fail (or it proves nothing).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  set(SL_ZE_SPIRV_FMA)
  foreach(m base f64)
    if(m STREQUAL base)
      set(id 0)
    else()
      set(id 1)
    endif()
    set(spv ${SL_ZE_SPIRV_DIR}/fma-mutant/kernels_${m}_contract_on.spv)
    sl_ze_spirv_module(${spv} ${id} on)
    list(APPEND SL_ZE_SPIRV_FMA ${spv})
  endforeach()
  add_custom_target(sl_ze_spirv_fma ALL DEPENDS ${SL_ZE_SPIRV_FMA})
  list(GET SL_ZE_SPIRV_FILES 0 base_spv)
  list(GET SL_ZE_SPIRV_FILES 1 f64_spv)
  list(GET SL_ZE_SPIRV_FMA 0 base_fma)
  list(GET SL_ZE_SPIRV_FMA 1 f64_fma)
  add_test(NAME test_ze_spirv
           COMMAND ${Python3_EXECUTABLE} ${SL_ZE_SRC}/check_spirv.py --dis ${SL_SPIRV_DIS}
                   --names $<TARGET_FILE:test_ze_kernels>
                   --base ${base_spv} --f64 ${f64_spv} --expect-fma-base ${base_fma} --expect-fma-f64 ${f64_fma})
  set_tests_properties(test_ze_spirv PROPERTIES LABELS "unit;level_zero" TIMEOUT 60)
else()
  message(WARNING "SHARDLOAD_WITH_LEVEL_ZERO: no python3: test_ze_spirv (no FMA, ContractionOff and the kernel "
                  "names in the SPIR-V) is not registered")
endif()
