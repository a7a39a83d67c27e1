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
if(KILN_SANITIZE_THREAD)
  if(KILN_SANITIZE)
    message(FATAL_ERROR "KILN_SANITIZE and KILN_SANITIZE_THREAD cannot be combined")
  endif()
  # -Wno-tsan: GCC warns that TSan does not model atomic_thread_fence (used by libstdc++ and
  # Boost.Asio headers); the fences are not kiln's.
  target_compile_options(kiln_options INTERFACE -fsanitize=thread -fno-omit-frame-pointer -Wno-tsan)
  target_link_options(kiln_options INTERFACE -fsanitize=thread)
  # Debian's abseil is not instrumented: base/tsan_absl_sync.cc tells TSan what its locks do.
  # Executables link it (kiln_tsan_sync_for), so that its definitions come first.
  add_library(kiln_tsan_absl_sync OBJECT ${PROJECT_SOURCE_DIR}/base/tsan_absl_sync.cc)
  target_compile_options(kiln_tsan_absl_sync PRIVATE -fsanitize=thread)
endif()
function(kiln_tsan_sync_for target)
  if(KILN_SANITIZE_THREAD)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:kiln_tsan_absl_sync>)
    target_link_libraries(${target} PRIVATE ${CMAKE_DL_LIBS})
    # Exported, so that abseil's and gRPC's own calls reach them too.
    set_target_properties(${target} PROPERTIES ENABLE_EXPORTS ON)
  endif()
endfunction()
target_include_directories(kiln_options INTERFACE ${PROJECT_SOURCE_DIR})
