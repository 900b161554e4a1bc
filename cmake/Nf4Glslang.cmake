# SPDX-License-Identifier: MIT
# Decides whether the Vulkan backend builds shaders/gemv_coop.comp: NF4_GLSLANG_VALIDATOR must
# compile a cooperative-matrix probe, and a spirv-val that knows SPV_KHR_cooperative_matrix (the one
# beside it, else NF4_COOP_SPIRV_VAL) must accept it. Sets NF4_VULKAN_COOP (ON/OFF) and says why in
# the configure log.
set(NF4_VULKAN_COOP OFF)
set(nf4_coop_why "")
if(NOT NF4_GLSLANG_VALIDATOR)
  set(nf4_coop_why "no glslangValidator found (tools/install-glslang.sh, or -DNF4_GLSLANG_VALIDATOR=PATH)")
else()
  get_filename_component(nf4_glslang_dir ${NF4_GLSLANG_VALIDATOR} DIRECTORY)
  find_program(NF4_COOP_SPIRV_VAL spirv-val HINTS ${nf4_glslang_dir} NO_DEFAULT_PATH
               DOC "spirv-val that knows SPV_KHR_cooperative_matrix (default: the one beside NF4_GLSLANG_VALIDATOR)")
  set(nf4_probe_dir ${CMAKE_CURRENT_BINARY_DIR}/nf4_coop_probe)
  file(MAKE_DIRECTORY ${nf4_probe_dir})
  file(WRITE ${nf4_probe_dir}/probe.comp [=[
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer O { float o[]; };
shared uint s[128];
void main() {
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
  coopMatLoad(a, s, 0, 8, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(b, s, 0, 8, gl_CooperativeMatrixLayoutColumnMajor);
  c = coopMatMulAdd(a, b, c);
  coopMatStore(c, o, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
]=])
  execute_process(COMMAND ${NF4_GLSLANG_VALIDATOR} -V --target-env vulkan1.2 ${nf4_probe_dir}/probe.comp -o ${nf4_probe_dir}/probe.spv
                  RESULT_VARIABLE nf4_rc OUTPUT_VARIABLE nf4_out ERROR_VARIABLE nf4_out)
  if(NOT nf4_rc EQUAL 0)
    string(REGEX REPLACE "\n.*" "" nf4_first "${nf4_out}")
    set(nf4_coop_why "${NF4_GLSLANG_VALIDATOR} cannot compile GL_KHR_cooperative_matrix (glslang >= 13 needed)")
  elseif(NOT NF4_COOP_SPIRV_VAL)
    set(nf4_coop_why "no spirv-val beside ${NF4_GLSLANG_VALIDATOR} (-DNF4_COOP_SPIRV_VAL=PATH)")
  else()
    execute_process(COMMAND ${NF4_COOP_SPIRV_VAL} --target-env vulkan1.2 ${nf4_probe_dir}/probe.spv RESULT_VARIABLE nf4_rc
                    OUTPUT_QUIET ERROR_QUIET)
    if(NOT nf4_rc EQUAL 0)
      set(nf4_coop_why "${NF4_COOP_SPIRV_VAL} rejects SPV_KHR_cooperative_matrix")
    else()
      set(NF4_VULKAN_COOP ON)
    endif()
  endif()
endif()
if(NF4_VULKAN_COOP)
  message(STATUS "nf4 vulkan fast product (gemv_coop.comp): built with ${NF4_GLSLANG_VALIDATOR}")
else()
  message(STATUS "nf4 vulkan fast product (gemv_coop.comp): NOT built, ${nf4_coop_why}; NF4_GEMV_FAST runs the exact contract on Vulkan")
endif()
