# FindNCCL: locates the NVIDIA Collective Communications Library.
#
# Looks in NCCL_ROOT, $ENV{NCCL_ROOT}, $ENV{NCCL_HOME}, the CUDA toolkit and the system.
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the imported
# target NCCL::NCCL.
include(FindPackageHandleStandardArgs)

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_TARGET_DIR)
  list(APPEND _nccl_hints ${CUDAToolkit_TARGET_DIR})
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_nccl_hints} PATH_SUFFIXES lib64 lib)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  string(REGEX REPLACE ".*NCCL_MAJOR +([0-9]+).*" "\\1" _nccl_major "${_nccl_ver}")
  string(REGEX REPLACE ".*NCCL_MINOR +([0-9]+).*" "\\1" _nccl_minor "${_nccl_ver}")
  string(REGEX REPLACE ".*NCCL_PATCH +([0-9]+).*" "\\1" _nccl_patch "${_nccl_ver}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()

find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
