# SPDX-License-Identifier: MIT
# nf4_backend_option(NAME HELP): a tri-state NAME=AUTO|ON|OFF. The backend's CMakeLists decides
# whether AUTO finds what it needs; it sets NAME_ENABLED. ON fails the configure if something is
# missing, AUTO quietly disables the backend, OFF skips it.
function(nf4_backend_option name help)
  set(${name} AUTO CACHE STRING "${help}: AUTO, ON or OFF")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${name}}" value)
  if(NOT value MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${name} must be AUTO, ON or OFF (got '${${name}}')")
  endif()
  set(${name}_ENABLED OFF PARENT_SCOPE)
  set(${name}_VALUE ${value} PARENT_SCOPE)
endfunction()

# nf4_backend_require(NAME FOUND WHAT): resolves NAME_ENABLED from NAME_VALUE and FOUND.
macro(nf4_backend_require name found what)
  if(${name}_VALUE STREQUAL "OFF")
    set(${name}_ENABLED OFF)
  elseif(${found})
    set(${name}_ENABLED ON)
  elseif(${name}_VALUE STREQUAL "ON")
    message(FATAL_ERROR "${name}=ON but ${what} was not found")
  else()
    message(STATUS "${name}=AUTO: ${what} not found, backend disabled")
    set(${name}_ENABLED OFF)
  endif()
endmacro()
