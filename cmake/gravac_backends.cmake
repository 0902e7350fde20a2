# gravac's GPU backends, included by the top-level CMakeLists.txt.
#
#   gravac::cuda  the CUDA kernels and device compressors (CUDA language, CUDA::cudart)
#   gravac::nccl  the NCCL communicator (NCCL, plus gravac::mpi to exchange the unique id)
#
# Both are created only when a CUDA compiler and the toolkit are found; without nvcc the
# build configures and builds everything else as before. CMAKE_CUDA_ARCHITECTURES
# defaults to "80;90" (A100, H100/H200) and can be overridden on the command line.
option(GRAVAC_ENABLE_CUDA "Create gravac::cuda (and gravac::nccl) when a CUDA compiler is found" ON)
if(NOT GRAVAC_ENABLE_CUDA)
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "gravac: no CUDA compiler found, gravac::cuda and gravac::nccl disabled")
  return()
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures gravac's kernels are built for")
endif()
enable_language(CUDA)
find_package(CUDAToolkit)
if(NOT CUDAToolkit_FOUND)
  message(STATUS "gravac: CUDA toolkit not found, gravac::cuda and gravac::nccl disabled")
  return()
endif()

add_library(gravac_cuda INTERFACE)
add_library(gravac::cuda ALIAS gravac_cuda)
set_target_properties(gravac_cuda PROPERTIES EXPORT_NAME cuda)
# The CUDA runtime gravac::cuda links: shared by default; static for scripts/gpu-kit, whose
# binaries travel to a machine that may have a driver but no toolkit.
option(GRAVAC_CUDART_STATIC "Link gravac::cuda (and gravac's CUDA tests) with the static CUDA runtime" OFF)
if(GRAVAC_CUDART_STATIC)
  set(GRAVAC_CUDART CUDA::cudart_static)
else()
  set(GRAVAC_CUDART CUDA::cudart)
endif()
target_link_libraries(gravac_cuda INTERFACE gravac ${GRAVAC_CUDART})
# The kernels are templates in headers: whatever includes them must be compiled as CUDA
# (C++20). --extended-lambda lets device code take lambdas; --expt-relaxed-constexpr lets
# the kernels call the core's constexpr helpers (pad8, index_width_for).
# (CMake 3.25 does not know nvcc 13's feature table, so the standard is a flag, not cuda_std_20.)
target_compile_options(gravac_cuda INTERFACE
  $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --extended-lambda --expt-relaxed-constexpr>)
# CCCL (CUB) lives in include/cccl from CUDA 13 on; nvcc finds it by itself, but say so
# for other CUDA compilers.
if(EXISTS "${CUDAToolkit_INCLUDE_DIRS}/cccl")
  target_include_directories(gravac_cuda SYSTEM INTERFACE "${CUDAToolkit_INCLUDE_DIRS}/cccl")
endif()
list(APPEND _gravac_export_targets gravac_cuda)
message(STATUS "gravac: gravac::cuda enabled (CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")

find_package(NCCL)
if(NCCL_FOUND AND TARGET gravac::mpi)
  add_library(gravac_nccl INTERFACE)
  add_library(gravac::nccl ALIAS gravac_nccl)
  set_target_properties(gravac_nccl PROPERTIES EXPORT_NAME nccl)
  target_link_libraries(gravac_nccl INTERFACE gravac_cuda gravac_mpi NCCL::NCCL)
  list(APPEND _gravac_export_targets gravac_nccl)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gravac)
  message(STATUS "gravac: gravac::nccl enabled (NCCL ${NCCL_VERSION})")
elseif(NOT NCCL_FOUND)
  message(STATUS "gravac: NCCL not found, gravac::nccl disabled")
else()
  message(STATUS "gravac: gravac::nccl needs gravac::mpi (MPI not found), disabled")
endif()
