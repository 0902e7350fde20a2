# gravac::c: the C ABI (include/gravac_c.h) over gravac::runtime, as a versioned shared
# library, libgravac_c.so.1 (every symbol versioned GRAVAC_C_1 by src/c_api/gravac_c.map;
# nothing of C++ exported). Included by the top-level CMakeLists.txt after gravac_runtime.cmake.
if(NOT TARGET gravac_runtime)
  return()
endif()
add_library(gravac_c SHARED src/c_api/gravac_c.cpp)
add_library(gravac::c ALIAS gravac_c)
set_target_properties(gravac_c PROPERTIES
  OUTPUT_NAME gravac_c VERSION ${PROJECT_VERSION} SOVERSION 1 EXPORT_NAME c
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
  LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/c_api/gravac_c.map)
target_compile_definitions(gravac_c PRIVATE GRAVAC_C_VERSION_STRING="${PROJECT_VERSION}")
target_compile_options(gravac_c PRIVATE ${GRAVAC_OWN_WARNINGS})
target_include_directories(gravac_c PUBLIC
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(gravac_c PRIVATE gravac_runtime)
# Under add_subdirectory it is built only when something links it (building it compiles
# the whole runtime: minutes).
if(NOT PROJECT_IS_TOP_LEVEL)
  set_target_properties(gravac_c PROPERTIES EXCLUDE_FROM_ALL ON)
endif()
target_link_options(gravac_c PRIVATE
  "LINKER:--version-script=${CMAKE_CURRENT_SOURCE_DIR}/src/c_api/gravac_c.map"
  "LINKER:--no-undefined")
# The C library and its SONAME link in lib/; the Python package's copy is one file,
# gravac/libgravac_c.so.1 (the SONAME, which ctypes loads by path), in the component
# "python" that only an explicit `cmake --install --component python` installs.
# (OPTIONAL: under add_subdirectory the library exists only if something built it.)
install(TARGETS gravac_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} OPTIONAL)
install(FILES $<TARGET_FILE:gravac_c> DESTINATION gravac RENAME libgravac_c.so.1
        COMPONENT python EXCLUDE_FROM_ALL)
