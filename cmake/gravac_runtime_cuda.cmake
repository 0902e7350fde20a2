# gravac::runtime_cuda: the runtime composition over CUDA device memory
# (include/gravac/runtime/make_device_trainer.hpp): every trainer<C_cuda, K, P> that
# composition_verdict accepts for gravac's device compressors, compiled once by nvcc. When
# GRAVAC_C_CUDA is on (the default), libgravac_c gets its CUDA path from it
# (src/c_api/gravac_c_cuda.cu: device communicators over callbacks, device trainers).
# Included by the top-level CMakeLists.txt after gravac_backends.cmake (gravac::cuda).
if(NOT TARGET gravac_runtime OR NOT TARGET gravac_cuda)
  return()
endif()
add_library(gravac_runtime_cuda STATIC
  src/runtime_cuda/make_device_trainer.cu
  src/runtime_cuda/trainers_selection.cu
  src/runtime_cuda/trainers_adacomp.cu)
add_library(gravac::runtime_cuda ALIAS gravac_runtime_cuda)
set_target_properties(gravac_runtime_cuda PROPERTIES EXPORT_NAME runtime_cuda POSITION_INDEPENDENT_CODE ON
                      CUDA_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_link_libraries(gravac_runtime_cuda PUBLIC gravac_runtime gravac_cuda)
option(GRAVAC_C_CUDA "Give libgravac_c its CUDA path (device trainers over device callbacks) when CUDA is found" ON)
# Built when something links it: libgravac_c's CUDA path, or a user's target. Without the
# CUDA path (scripts/test) nothing does, and its nvcc build (minutes) is left out, and
# not installed.
if(NOT PROJECT_IS_TOP_LEVEL OR NOT GRAVAC_C_CUDA)
  set_target_properties(gravac_runtime_cuda PROPERTIES EXCLUDE_FROM_ALL ON)
else()
  list(APPEND _gravac_export_targets gravac_runtime_cuda)
endif()

if(GRAVAC_C_CUDA AND TARGET gravac_c)
  target_sources(gravac_c PRIVATE src/c_api/gravac_c_cuda.cu)
  target_compile_definitions(gravac_c PRIVATE GRAVAC_C_WITH_CUDA)
  # gravac_c was created before CUDA was enabled, so it took no architectures from
  # CMAKE_CUDA_ARCHITECTURES (set by gravac_backends.cmake when the user gave none).
  set_target_properties(gravac_c PROPERTIES CUDA_VISIBILITY_PRESET hidden CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
  target_link_libraries(gravac_c PRIVATE gravac_runtime_cuda)
  message(STATUS "gravac: libgravac_c with its CUDA path (gravac::runtime_cuda)")
endif()
