# Warnings and sanitizers for kiln's own targets (never imposed on users of kiln::kiln).
function(kiln_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-psabi)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # The kernels silence GCC-only warnings by name (-Wmaybe-uninitialized), which clang does not know.
    target_compile_options(${target} PRIVATE -Wno-unknown-warning-option)
  endif()
  if(KILN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

if(KILN_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()

# UndefinedBehaviorSanitizer alone, at an optimised build's speed (scripts/build.sh clang): with clang it
# also checks float-to-integer conversions that overflow (float-cast-overflow, which GCC lacks), the
# undefined casts a numeric command-line flag such as -n 1e20 used to reach.
if(KILN_UBSAN)
  set(kiln_ubsan undefined)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    string(APPEND kiln_ubsan ",float-cast-overflow")
  endif()
  add_compile_options(-fsanitize=${kiln_ubsan} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${kiln_ubsan})
endif()
