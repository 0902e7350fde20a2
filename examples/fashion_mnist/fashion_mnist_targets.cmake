# The Fashion-MNIST example's reusable parts, shared by the example, its tests
# (tests/examples) and the reproduction experiment (bench/reproduce). Included from each
# of them; the first include defines the targets.
#   gravac_fashion_mnist_headers  INTERFACE: data reader, models, optimizer (Eigen, zlib)
#   gravac_fashion_mnist_core     STATIC: the training loop, over the library's runtime
#                                 composition (gravac::runtime)
if(TARGET gravac_fashion_mnist_headers OR DEFINED _gravac_fashion_mnist_skipped)
  return()
endif()
find_package(Eigen3 3.3 QUIET NO_MODULE)
find_package(ZLIB QUIET)
if(NOT TARGET Eigen3::Eigen OR NOT ZLIB_FOUND)
  message(STATUS "gravac: Eigen3 or zlib not found, the Fashion-MNIST example is disabled")
  set(_gravac_fashion_mnist_skipped ON CACHE INTERNAL "")
  return()
endif()

option(GRAVAC_EXAMPLES_NATIVE "Compile the example's models for the build machine's CPU (-march=native)" ON)
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-march=native GRAVAC_HAVE_MARCH_NATIVE)

add_library(gravac_fashion_mnist_headers INTERFACE)
target_include_directories(gravac_fashion_mnist_headers INTERFACE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(gravac_fashion_mnist_headers INTERFACE gravac::gravac Eigen3::Eigen ZLIB::ZLIB)
if(GRAVAC_EXAMPLES_NATIVE AND GRAVAC_HAVE_MARCH_NATIVE)
  target_compile_options(gravac_fashion_mnist_headers INTERFACE -march=native)
endif()

# The training loop, its checkpoints and its console/CSV/plot output; the trainers come from
# gravac::runtime (without it, as in the sanitizer builds, only the headers target exists).
if(NOT TARGET gravac::runtime)
  message(STATUS "gravac: the Fashion-MNIST training library needs gravac::runtime; skipped")
  return()
endif()
add_library(gravac_fashion_mnist_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/src/train.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/report.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/checkpoint.cpp)
target_link_libraries(gravac_fashion_mnist_core PUBLIC gravac_fashion_mnist_headers gravac::runtime)
target_compile_options(gravac_fashion_mnist_core PRIVATE ${GRAVAC_OWN_WARNINGS})
