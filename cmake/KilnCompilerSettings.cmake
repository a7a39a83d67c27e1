# Compiler launcher, warnings and sanitizers shared by every kiln target.
find_program(KILN_CCACHE ccache)
if(KILN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${KILN_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${KILN_CCACHE})
endif()

add_library(kiln_options INTERFACE)
target_compile_options(kiln_options INTERFACE -Wall -Wextra -Wpedantic -Wno-missing-field-initializers)
if(KILN_WERROR)
  target_compile_options(kiln_options INTERFACE -Werror)
endif()
# kiln's own kernels are compiled for the build machine's vector units (AVX-512 where present);
# oneDNN picks its kernels at run time either way. Turn off for binaries that must run elsewhere.
option(KILN_NATIVE_ARCH "Compile kiln's kernels for the build machine (-march=native)" ON)
if(KILN_NATIVE_ARCH)
  target_compile_options(kiln_options INTERFACE -march=native)
endif()
if(KILN_SANITIZE)
  target_compile_options(kiln_options INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer
                                                 -fno-sanitize-recover=undefined)
  target_link_options(kiln_options INTERFACE -fsanitize=address,undefined)
endif()
target_include_directories(kiln_options INTERFACE ${PROJECT_SOURCE_DIR})
