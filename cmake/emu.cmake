# The emulated CUDA device (-DBERTLUA_CUDA_EMU=ON, tests/emu/README.md).
# kernels/*.cu are copied to the build tree by emu_rewrite (which turns <<<>>> into a launch call) and compiled as
# host C++ against the headers of tests/emu (cuda_runtime.h, cuda_fp16.h, ...), with every tests/emu/*.cpp.
file(GLOB BL_EMU_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/*.cu)
file(GLOB BL_EMU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/emu/*.cpp)
add_executable(emu_rewrite ${CMAKE_SOURCE_DIR}/cmake/emu_rewrite.c)
set(BL_CUDA_SOURCES ${BL_EMU_SOURCES})
# The host C++ copy of a .cu file, in the build tree.
function(bl_emu_rewrite cu out_var)
  get_filename_component(name ${cu} NAME_WE)
  set(out ${CMAKE_BINARY_DIR}/emu_kernels/${name}.cpp)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/emu_kernels
    COMMAND emu_rewrite ${cu} ${out}
    DEPENDS ${cu} emu_rewrite
    COMMENT "Emulated CUDA: rewriting ${name}.cu")
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()
foreach(cu ${BL_EMU_KERNELS})
  bl_emu_rewrite(${cu} out)
  list(APPEND BL_CUDA_SOURCES ${out})
  list(APPEND BL_EMU_GENERATED ${out})
endforeach()
set(BL_EMU_DIR ${CMAKE_SOURCE_DIR}/tests/emu)
# Under ThreadSanitizer only the kernels and the emulated libraries are instrumented: not the device emulation
# (its bookkeeping between fibers is ordered by the scheduler, which TSan cannot see), nor the CPU code (whose
# load-time ISA selection runs before TSan is initialised).
set(BL_EMU_TSAN_FLAGS "")
if(BERTLUA_CUDA_EMU_TSAN)
  set(BL_EMU_TSAN_FLAGS "-fsanitize=thread;-fno-omit-frame-pointer;-g")   # -g: file:line in reports
endif()
set(BL_EMU_LIB_SOURCES ${BL_EMU_SOURCES})
list(REMOVE_ITEM BL_EMU_LIB_SOURCES ${BL_EMU_DIR}/emu_fiber.cpp ${BL_EMU_DIR}/emu_runtime.cpp)

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
  # BERTLUA_CUDA_EMU_CONTRACT: the kernels contract as nvcc does by default (-ffp-contract=fast, with FMA
  # instructions), to try tolerances and bit-identity claims under contraction (issue 31).
  set(BL_EMU_CONTRACT "-ffp-contract=off")
  if(BERTLUA_CUDA_EMU_CONTRACT)
    set(BL_EMU_CONTRACT "-ffp-contract=fast;-mfma")
  endif()
  set_source_files_properties(${BL_EMU_GENERATED} PROPERTIES
    INCLUDE_DIRECTORIES "${CMAKE_SOURCE_DIR}/kernels"
    COMPILE_OPTIONS "-include;cuda_runtime.h;${BL_EMU_CONTRACT};-Wall;-Wextra;-Wno-unknown-pragmas;${BL_EMU_TSAN_FLAGS}")
  set_source_files_properties(${BL_EMU_SOURCES} PROPERTIES COMPILE_OPTIONS "-ffp-contract=off;-Wall;-Wextra")
  if(BL_EMU_LIB_SOURCES)
    set_source_files_properties(${BL_EMU_LIB_SOURCES} PROPERTIES
      COMPILE_OPTIONS "-ffp-contract=off;-Wall;-Wextra;${BL_EMU_TSAN_FLAGS}")
  endif()
endfunction()

# Self-tests of the emulator: tests/emu/test_*.cu, rewritten like the kernels and linked with the library.
function(bl_emu_tests)
  file(GLOB BL_EMU_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/emu/test_*.cu)
  foreach(cu ${BL_EMU_TESTS})
    get_filename_component(name ${cu} NAME_WE)
    bl_emu_rewrite(${cu} out)
    add_executable(${name} ${out})
    target_include_directories(${name} BEFORE PRIVATE ${BL_EMU_DIR})
    target_compile_options(${name} PRIVATE -include cuda_runtime.h -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas
                           ${BL_EMU_TSAN_FLAGS})
    target_link_libraries(${name} PRIVATE bertlua)
    add_test(NAME emu_${name} COMMAND ${name})
    set_tests_properties(emu_${name} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
    if(name STREQUAL "test_emu_block_race")   # two blocks in flight at once
      set_tests_properties(emu_${name} PROPERTIES ENVIRONMENT BL_EMU_BLOCKS=2)
    endif()
    if(BERTLUA_CUDA_EMU_TSAN)
      target_compile_definitions(${name} PRIVATE BL_EMU_TSAN=1)
      if(name STREQUAL "test_emu_race")
        set_tests_properties(emu_${name} PROPERTIES
          PASS_REGULAR_EXPRESSION "ThreadSanitizer: data race.*reverse_without_barrier.*test_emu_race.cu:10")
      elseif(name STREQUAL "test_emu_block_race")
        set_tests_properties(emu_${name} PROPERTIES
          PASS_REGULAR_EXPRESSION "ThreadSanitizer: data race.*sum_without_atomic.*test_emu_block_race.cu:9")
      endif()
    endif()
  endforeach()
endfunction()
