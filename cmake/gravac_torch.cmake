# gravac::torch: the LibTorch adapter (include/gravac/adapters/torch.hpp), included by the
# top-level CMakeLists.txt. Created only when find_package(Torch) succeeds (Debian:
# libtorch-dev); without LibTorch everything else configures and builds as before.
option(GRAVAC_ENABLE_TORCH "Create gravac::torch when LibTorch is found" ON)
if(NOT GRAVAC_ENABLE_TORCH)
  return()
endif()
find_package(Torch QUIET)
if(NOT TORCH_FOUND)
  message(STATUS "gravac: LibTorch not found, gravac::torch disabled")
  return()
endif()

add_library(gravac_torch INTERFACE)
add_library(gravac::torch ALIAS gravac_torch)
set_target_properties(gravac_torch PROPERTIES EXPORT_NAME torch)
# Link LibTorch's imported targets by name (not TORCH_LIBRARIES, which holds absolute
# paths): the installed package then asks find_dependency(Torch) for them.
# torch carries the include directories and the ABI flag, torch_library the libraries.
target_link_libraries(gravac_torch INTERFACE gravac torch torch_library)
list(APPEND _gravac_export_targets gravac_torch)
message(STATUS "gravac: gravac::torch enabled (LibTorch ${Torch_VERSION})")
