# SPDX-License-Identifier: MIT
# Install rules (NF4_INSTALL): the library nf4::nf4, the public headers, the CLI, the CMake package
# (nf4Config.cmake, nf4ConfigVersion.cmake, nf4Targets.cmake) and nf4.pc. Every installed file is
# relocatable: `cmake --install build --prefix P` may pick any prefix after the build.
include(CMakePackageConfigHelpers)

set(NF4_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/nf4 CACHE STRING
    "Where nf4Config.cmake is installed, relative to the prefix")
mark_as_advanced(NF4_INSTALL_CMAKEDIR)

install(TARGETS nf4lib EXPORT nf4Targets
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT nf4_runtime
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT nf4_runtime NAMELINK_COMPONENT nf4_development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT nf4_development)

set(nf4_public_headers include/nf4/nf4.h include/nf4/nf4.hpp ${NF4_GENERATED_INCLUDE_DIR}/nf4/version.h)
if(NF4_VULKAN_ENABLED)
  list(APPEND nf4_public_headers include/nf4/nf4_vulkan.h)
endif()
install(FILES ${nf4_public_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/nf4 COMPONENT nf4_development)

if(TARGET nf4)
  install(TARGETS nf4 RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT nf4_runtime)
endif()
install(FILES LICENSE CHANGELOG.md README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT nf4_runtime)

# CMake package.
install(EXPORT nf4Targets NAMESPACE nf4:: DESTINATION ${NF4_INSTALL_CMAKEDIR} COMPONENT nf4_development)
configure_package_config_file(cmake/nf4Config.cmake.in ${PROJECT_BINARY_DIR}/nf4Config.cmake
  INSTALL_DESTINATION ${NF4_INSTALL_CMAKEDIR})
# The library's SONAME changes with the major version: so does what find_package accepts.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/nf4ConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/nf4Config.cmake ${PROJECT_BINARY_DIR}/nf4ConfigVersion.cmake
  DESTINATION ${NF4_INSTALL_CMAKEDIR} COMPONENT nf4_development)

# pkg-config: the prefix is found from the .pc file's own place (${pcfiledir}).
set(nf4_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "nf4.pc needs CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR relative to the prefix")
endif()
file(RELATIVE_PATH NF4_PC_RELATIVE_PREFIX /prefix/${nf4_pc_dir} /prefix)
string(REGEX REPLACE "/$" "" NF4_PC_RELATIVE_PREFIX "${NF4_PC_RELATIVE_PREFIX}")
set(NF4_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
set(NF4_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
# A shared libnf4 in a prefix the loader does not search (/opt/nf4): the program records where it
# is, so `cc app.c $(pkg-config --cflags --libs nf4)` gives a program that starts as it is, without
# LD_LIBRARY_PATH or ldconfig.
set(NF4_PC_RPATH "")
if(NF4_SHARED)
  set(NF4_PC_RPATH " -Wl,-rpath,\${libdir}")
endif()
# What a static link (pkg-config --static) adds; a shared libnf4 carries its own dependencies.
set(NF4_PC_LIBS_PRIVATE "")
if(NOT NF4_FMT_HEADER_ONLY)
  string(APPEND NF4_PC_LIBS_PRIVATE " -lfmt")
endif()
if(NF4_CUDA_ENABLED)
  find_package(CUDAToolkit REQUIRED)
  string(APPEND NF4_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lrt")
endif()
string(APPEND NF4_PC_LIBS_PRIVATE " -pthread")
if(CMAKE_DL_LIBS)
  string(APPEND NF4_PC_LIBS_PRIVATE " -l${CMAKE_DL_LIBS}")
endif()
# nf4 is C++: a C program linking libnf4.a statically needs the C++ runtime as well.
foreach(lib IN LISTS CMAKE_CXX_IMPLICIT_LINK_LIBRARIES)
  if(NOT lib IN_LIST CMAKE_C_IMPLICIT_LINK_LIBRARIES)
    string(APPEND NF4_PC_LIBS_PRIVATE " -l${lib}")
  endif()
endforeach()
string(STRIP "${NF4_PC_LIBS_PRIVATE}" NF4_PC_LIBS_PRIVATE)
configure_file(cmake/nf4.pc.in ${PROJECT_BINARY_DIR}/nf4.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/nf4.pc DESTINATION ${nf4_pc_dir} COMPONENT nf4_development)
