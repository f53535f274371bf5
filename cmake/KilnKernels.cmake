# kiln_add_kernels(<name>): a static library <name> with kiln's SIMD kernels and the built-in architectures,
# compiled from kiln's six implementation files (cmake/kiln_impl*.cpp, installed beside this file) in
# parallel. A program links <name> instead of writing its own KILN_IMPLEMENTATION file, which with g++ 12
# at -O3 takes one core minutes and ~1.7 GB of memory; these six spread over the build's cores, and with
# GCC each collects its garbage more often (ggc-min-expand/heapsize below), which keeps every one of them
# under 1 GB (docs/building.md has the figures). <name> links kiln::kiln and nlohmann_json (kiln::load reads safetensors and
# config.json), and defines KILN_EXTERN_ARCHITECTURES for its users (their files that call kiln::load then
# skip compiling the architectures again).
set_property(GLOBAL PROPERTY KILN_KERNELS_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(kiln_add_kernels name)
  get_property(dir GLOBAL PROPERTY KILN_KERNELS_DIR)
  find_package(nlohmann_json 3.10 CONFIG QUIET)
  if(NOT nlohmann_json_FOUND)
    message(FATAL_ERROR "kiln_add_kernels: nlohmann-json not found (Debian: apt-get install nlohmann-json3-dev); "
                        "kiln::load needs it for safetensors and config.json")
  endif()
  add_library(${name} STATIC ${dir}/kiln_impl.cpp ${dir}/kiln_impl_matmul.cpp ${dir}/kiln_impl_quant.cpp
                             ${dir}/kiln_impl_dequant.cpp ${dir}/kiln_impl_i16.cpp ${dir}/kiln_impl_model.cpp)
  # GCC sizes its garbage-collection threshold by the machine's memory (up to ~100% heap growth between
  # collections); these kernels instantiate many templates per SIMD target, so a tighter threshold cuts the
  # peak by a quarter or more at a few percent of compile time.
  target_compile_options(${name} PRIVATE
    "$<$<CXX_COMPILER_ID:GNU>:SHELL:--param ggc-min-expand=20>"
    "$<$<CXX_COMPILER_ID:GNU>:SHELL:--param ggc-min-heapsize=131072>")
  target_link_libraries(${name} PUBLIC kiln::kiln nlohmann_json::nlohmann_json)
  target_compile_definitions(${name} PUBLIC KILN_EXTERN_ARCHITECTURES=1)
endfunction()
