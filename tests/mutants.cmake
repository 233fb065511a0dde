# Mutation checks of the asynchronous contract (docs/DESIGN.md#data-flow): the loader's data
# path is built again with one event wait or record removed (SL__MUTANT=n selects the
# SL__KEEP(n) hook; the files that carry hooks are SL_MUTANT_SOURCES, the mutants SL_MUTANTS,
# both in CMakeLists.txt beside the core's sources, which checks them), linked ahead of the real
# library, and the placement matrix on the sim backend (device route and host staging, world 2
# and the 2x2 HSDP mesh) must then FAIL with a data or placement difference. A mutant that survives means the matrix cannot see that wait.
# Not in sanitizer builds: the matrix alone takes minutes there.
if(NOT SHARDLOAD_SANITIZE AND SHARDLOAD_WITH_GLOO)
  foreach(m ${SL_MUTANTS})
    # an object library: its objects always link, ahead of the archive's real ones
    add_library(sl_mutant_${m} OBJECT ${SL_MUTANT_SOURCES})
    target_compile_definitions(sl_mutant_${m} PRIVATE SL__MUTANT=${m} SHARDLOAD_BUILDING)
    target_include_directories(sl_mutant_${m} PRIVATE ${PROJECT_SOURCE_DIR}/core/src
                               ${PROJECT_SOURCE_DIR}/core/include ${PROJECT_BINARY_DIR}/include)
    add_executable(test_matrix_mutant_${m} ${CMAKE_CURRENT_SOURCE_DIR}/test_matrix.c $<TARGET_OBJECTS:sl_mutant_${m}>)
    target_compile_definitions(test_matrix_mutant_${m} PRIVATE SL_MATRIX_MUTANT=${m})
    target_link_libraries(test_matrix_mutant_${m} PRIVATE sl_testutil)
    set_target_properties(test_matrix_mutant_${m} PROPERTIES LINKER_LANGUAGE CXX)
    add_test(NAME mutant_${m} COMMAND test_matrix_mutant_${m})
    # killed = the matrix reports a wrong element, placement or load failure (never a hang)
    set_tests_properties(mutant_${m} PROPERTIES LABELS mutant TIMEOUT 600
                         PASS_REGULAR_EXPRESSION "MUTANT KILLED")
  endforeach()
endif()

# The same for the order of a lent tensor's free (docs/DESIGN.md#modules, Lent memory): state.c
# built with SL__MUTANT_EXPORT=n (1: the free is not ordered after the consumers; 2: the fallback
# does not wait), linked ahead of the real library; test_export's sim scenarios must then fail.
if(NOT SHARDLOAD_SANITIZE)
  foreach(m 1 2)
    add_library(sl_mutant_export_${m} OBJECT ${PROJECT_SOURCE_DIR}/core/src/state.c)
    target_compile_definitions(sl_mutant_export_${m} PRIVATE SL__MUTANT_EXPORT=${m} SHARDLOAD_BUILDING)
    target_include_directories(sl_mutant_export_${m} PRIVATE ${PROJECT_SOURCE_DIR}/core/src
                               ${PROJECT_SOURCE_DIR}/core/include ${PROJECT_BINARY_DIR}/include)
    add_executable(test_export_mutant_${m} ${CMAKE_CURRENT_SOURCE_DIR}/test_export.c
                   $<TARGET_OBJECTS:sl_mutant_export_${m}>)
    target_compile_definitions(test_export_mutant_${m} PRIVATE SL_EXPORT_MUTANT=${m})
    target_link_libraries(test_export_mutant_${m} PRIVATE sl_testutil)
    set_target_properties(test_export_mutant_${m} PROPERTIES LINKER_LANGUAGE CXX)
    add_test(NAME mutant_export_${m} COMMAND test_export_mutant_${m})
    set_tests_properties(mutant_export_${m} PROPERTIES LABELS mutant TIMEOUT 300
                         PASS_REGULAR_EXPRESSION "MUTANT KILLED")
  endforeach()
endif()
