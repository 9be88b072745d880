# The emulated CUDA device (-DBERTLUA_CUDA_EMU=ON, tests/emu/README.md).
# kernels/*.cu are copied to the build tree by emu_rewrite (which turns <<<>>> into a launch call) and compiled as
# host C++ against the headers of tests/emu (cuda_runtime.h, cuda_fp16.h, ...), with every tests/emu/*.cpp.
file(GLOB BL_EMU_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.cu)
file(GLOB BL_EMU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/emu/*.cpp)
file(GLOB BL_EMU_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/emu/*.h ${CMAKE_SOURCE_DIR}/kernels/*.cuh)
add_executable(emu_rewrite ${CMAKE_SOURCE_DIR}/cmake/emu_rewrite.c)
set(BL_CUDA_SOURCES ${BL_EMU_SOURCES})
if(NOT EXISTS ${CMAKE_SOURCE_DIR}/tests/emu/cublasLt.h)
  # Until the emulated cuBLASLt lands (branch emu-libs), the GEMM entry points report that they are missing.
  list(FILTER BL_EMU_KERNELS EXCLUDE REGEX "/gemm\\.cu$")
  set(no_gemm ${CMAKE_BINARY_DIR}/emu_kernels/no_gemm.c)
  file(WRITE ${no_gemm} "#include \"base/internal.h\"\n"
    "static int no(void) { return bl_set_error(BL_EDEVICE, \"GEMM: this emulated build has no cuBLASLt yet\"); }\n"
    "static int g_tf32;\nvoid bl_cuda_set_tf32(int e) { g_tf32 = e != 0; }\nint bl_cuda_get_tf32(void) { return g_tf32; }\n")
  foreach(f matmul linear_forward linear_gelu_forward linear_backward linear_dgelu_backward)
    file(APPEND ${no_gemm} "int bl_cuda_${f}() { return no(); }\n")
  endforeach()
  list(APPEND BL_CUDA_SOURCES ${no_gemm})
endif()
foreach(cu ${BL_EMU_KERNELS})
  get_filename_component(name ${cu} NAME_WE)
  set(out ${CMAKE_BINARY_DIR}/emu_kernels/${name}.cpp)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/emu_kernels
    COMMAND emu_rewrite ${cu} ${out}
    DEPENDS ${cu} emu_rewrite
    COMMENT "Emulated CUDA: rewriting ${name}.cu")
  list(APPEND BL_CUDA_SOURCES ${out})
  list(APPEND BL_EMU_GENERATED ${out})
endforeach()
set(BL_EMU_DIR ${CMAKE_SOURCE_DIR}/tests/emu)
# The device emulation itself is not instrumented by ThreadSanitizer: its bookkeeping between fibers is ordered by
# the scheduler, which TSan cannot see.
set_source_files_properties(${BL_EMU_DIR}/emu_fiber.cpp ${BL_EMU_DIR}/emu_runtime.cpp PROPERTIES
  COMPILE_OPTIONS "-fno-sanitize=thread")

function(bl_emu_configure target)
  target_compile_definitions(${target} PUBLIC BL_HAVE_CUDA=1 PRIVATE BL_CUDA_EMU=1)
  if(BL_HAVE_NCCL)
    target_compile_definitions(${target} PUBLIC BL_HAVE_NCCL=1)
  endif()
  if(BERTLUA_CUDA_EMU_TSAN)
    target_compile_definitions(${target} PRIVATE BL_EMU_TSAN=1)
  endif()
  # tests/emu first, so its cuda_runtime.h/nccl.h stand in for the toolkit's in C++ sources and in nccl.c.
  target_include_directories(${target} BEFORE PRIVATE ${BL_EMU_DIR})
  # -ffp-contract=off: nvcc fuses a*b+c by default, g++ may too; the emulator fuses nothing, so a kernel that must
  # match the CPU bit for bit has to say __fmaf_rn / __fmul_rn explicitly (it would differ on a real GPU otherwise).
  set_source_files_properties(${BL_EMU_GENERATED} PROPERTIES
    INCLUDE_DIRECTORIES "${CMAKE_SOURCE_DIR}/kernels"
    COMPILE_OPTIONS "-include;cuda_runtime.h;-ffp-contract=off;-Wall;-Wextra;-Wno-unknown-pragmas")
  set_source_files_properties(${BL_EMU_SOURCES} PROPERTIES COMPILE_OPTIONS "-ffp-contract=off;-Wall;-Wextra")
endfunction()

# Self-tests of the emulator: tests/emu/test_*.cu, rewritten like the kernels and linked with the library.
function(bl_emu_tests)
  file(GLOB BL_EMU_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/emu/test_*.cu)
  foreach(cu ${BL_EMU_TESTS})
    get_filename_component(name ${cu} NAME_WE)
    set(out ${CMAKE_BINARY_DIR}/emu_kernels/${name}.cpp)
    add_custom_command(OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/emu_kernels
      COMMAND emu_rewrite ${cu} ${out}
      DEPENDS ${cu} emu_rewrite)
    add_executable(${name} ${out})
    target_include_directories(${name} BEFORE PRIVATE ${BL_EMU_DIR})
    target_compile_options(${name} PRIVATE -include cuda_runtime.h -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas)
    target_link_libraries(${name} PRIVATE bertlua)
    add_test(NAME emu_${name} COMMAND ${name})
    set_tests_properties(emu_${name} PROPERTIES TIMEOUT 300)
  endforeach()
endfunction()
