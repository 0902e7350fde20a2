# gravac::runtime: the runtime composition (include/gravac/runtime/), a compiled library of
# every trainer<C, K, P> the library accepts, chosen by name (make_trainer). Included by the
# top-level CMakeLists.txt; it needs Eigen (PowerSGD is one of the compositions).
if(NOT GRAVAC_BUILD_RUNTIME)
  message(STATUS "gravac: gravac::runtime (and the C ABI) not built (GRAVAC_BUILD_RUNTIME=OFF)")
  return()
endif()
if(NOT TARGET gravac::powersgd)
  message(STATUS "gravac: Eigen not found, gravac::runtime (and the C ABI) disabled")
  return()
endif()
add_library(gravac_runtime STATIC
  src/runtime/make_trainer.cpp
  src/runtime/trainers_topk.cpp
  src/runtime/trainers_selection.cpp
  src/runtime/trainers_quantizer.cpp
  src/runtime/trainers_other.cpp
  src/runtime/trainers_block_scaled.cpp)
add_library(gravac::runtime ALIAS gravac_runtime)
set_target_properties(gravac_runtime PROPERTIES EXPORT_NAME runtime POSITION_INDEPENDENT_CODE ON
                      CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_link_libraries(gravac_runtime PUBLIC gravac_powersgd)
# The trainers are the hot path of every front end built on them: optimised in every build
# type. scripts/test builds them at -O1 (a quarter less compile time for CI's short runs;
# warnings_library checks the headers at -O2 and -O3).
set(GRAVAC_RUNTIME_OPTIMIZATION "-O2" CACHE STRING "Optimization of gravac::runtime's trainers")
target_compile_options(gravac_runtime PRIVATE ${GRAVAC_RUNTIME_OPTIMIZATION} ${GRAVAC_OWN_WARNINGS})
# Under add_subdirectory it is built only when something links it.
if(NOT PROJECT_IS_TOP_LEVEL)
  set_target_properties(gravac_runtime PROPERTIES EXCLUDE_FROM_ALL ON)
endif()
list(APPEND _gravac_export_targets gravac_runtime)
