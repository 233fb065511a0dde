# sl_add_test(NAME SOURCES src... [LABELS l...] [ARGS a...] [TIMEOUT s])
# One cmocka executable per module, registered with CTest. Tests link the static library so
# they can reach internals; they run from the build tree with SHARDLOAD_BIN pointing at the
# command and SHARDLOAD_TEST_TMP at a scratch directory.
function(sl_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LABELS;ARGS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE shardload_static ${CMOCKA_LINK} sl_testutil)
  set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
  add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "SHARDLOAD_BIN=$<TARGET_FILE:shardload_cli>;SHARDLOAD_TEST_TMP=${CMAKE_BINARY_DIR}/test-tmp/${name};CMOCKA_MESSAGE_OUTPUT=stdout")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
