# SPDX-License-Identifier: MIT
# nf4lib, exported as nf4::nf4 (ALIAS nf4::nf4 in the build tree): the library applications link.
# Made from nf4_internal's objects (nothing is compiled twice). Its interface is the public
# headers only: include/ and the generated nf4/version.h, never the repository root; fmt,
# nlohmann-json and the backends' dependencies stay private.
#
# Shared (NF4_SHARED, the default for nf4's own builds): libnf4.so.<major>, exporting only the
# nf4_* C API: the objects are compiled with hidden visibility and cmake/nf4.map hides everything
# else the linker would export (template instantiations from the standard library, the statically
# linked CUDA runtime).

set(nf4_objects $<TARGET_OBJECTS:nf4_internal>)
if(TARGET nf4_vulkan)
  list(APPEND nf4_objects $<TARGET_OBJECTS:nf4_vulkan>)
endif()
if(NF4_SHARED)
  add_library(nf4lib SHARED ${nf4_objects})
else()
  add_library(nf4lib STATIC ${nf4_objects})
endif()
add_library(nf4::nf4 ALIAS nf4lib)
set_target_properties(nf4lib PROPERTIES
  OUTPUT_NAME nf4
  EXPORT_NAME nf4
  LINKER_LANGUAGE CXX
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR})
target_include_directories(nf4lib INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${NF4_GENERATED_INCLUDE_DIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(nf4lib PRIVATE $<BUILD_INTERFACE:nf4_link_deps>)

if(NF4_SHARED)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    set(nf4_map ${PROJECT_SOURCE_DIR}/cmake/nf4.map)
    target_link_options(nf4lib PRIVATE "LINKER:--version-script=${nf4_map}")
    set_property(TARGET nf4lib APPEND PROPERTY LINK_DEPENDS ${nf4_map})
    # Every symbol the library needs must come from its own dependencies (not from the program
    # that loads it); sanitizer runtimes are provided by the program, so not with those.
    if(NOT NF4_SANITIZE AND NOT NF4_TSAN AND NOT NF4_FUZZ)
      target_link_options(nf4lib PRIVATE "LINKER:--no-undefined")
    endif()
  endif()
else()
  # A static nf4::nf4 carries its link dependencies to the application; installed, they are found
  # again by nf4Config.cmake.
  set(nf4_static_deps Threads::Threads)
  if(NOT NF4_FMT_HEADER_ONLY)
    list(APPEND nf4_static_deps fmt::fmt)
  endif()
  if(NF4_CUDA_ENABLED)
    list(APPEND nf4_static_deps CUDA::cudart_static)
  endif()
  if(NF4_CUDA_ENABLED OR NF4_VULKAN_ENABLED)
    list(APPEND nf4_static_deps ${CMAKE_DL_LIBS})
  endif()
  foreach(dep IN LISTS nf4_static_deps)
    target_link_libraries(nf4lib INTERFACE $<INSTALL_INTERFACE:${dep}>)
  endforeach()
endif()
