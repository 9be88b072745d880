# Test registration. Files are picked up by name, so adding a test never
# needs an edit here:
#   tests/c/test_*.c      C unit tests (one executable each)
#   tests/lua/test_*.lua  Lua tests run by the bertlua host
#   tests/mpi/test_*.lua  Lua tests run under `mpirun -np 2`
#   tests/hostile/test_*.lua  the hostile-input suite (full disks, FIFOs, NUL bytes, bad options...)
# A test that cannot run here (no GPU, no shared data, no torch) exits 77,
# which ctest reports as skipped, after printing why.
set(BL_SHARED_DATA ${CMAKE_SOURCE_DIR}/../shared/data)
# LUA_PATH: the test helpers (tests/lua/lib: testing, ref_loader); ";;" keeps the default path.
# BERTLUA_DEVICE=cpu: recipes run on the CPU unless a test names a --device (bertlua.train.device).
set(BL_TEST_ENV "BERTLUA_DEVICE=cpu;LUA_PATH=${CMAKE_SOURCE_DIR}/tests/lua/lib/?.lua\\;\\;;BL_SHARED_DATA=${BL_SHARED_DATA};BL_BUILD_DIR=${CMAKE_BINARY_DIR};BL_PYTHON=/usr/bin/python3;OMP_NUM_THREADS=2;OPENBLAS_NUM_THREADS=2")
if(BERTLUA_SANITIZE)
  # BL_SANITIZED lets long accuracy checks shrink to a smoke run (testing's T.sanitized()):
  # training runs ~10x slower under ASan, and the Release build checks the numbers.
  list(APPEND BL_TEST_ENV "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1" "UBSAN_OPTIONS=print_stacktrace=1" "BL_SANITIZED=1")
endif()

file(GLOB BL_C_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/c/test_*.c)
# the vecmath test compiles vecmath.h's loops itself: with the library's flags, so it measures the same code
set_source_files_properties(${CMAKE_SOURCE_DIR}/tests/c/test_ops_vecmath.c PROPERTIES COMPILE_OPTIONS "${BL_OPS_FLAGS}")
foreach(src ${BL_C_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE bertlua)
  target_compile_options(${name} PRIVATE ${BL_WARN})
  add_test(NAME c_${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(c_${name} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "${BL_TEST_ENV}" TIMEOUT 600)
endforeach()

file(GLOB BL_LUA_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/lua/test_*.lua)
foreach(src ${BL_LUA_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME lua_${name} COMMAND bertlua_host ${src} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(lua_${name} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "${BL_TEST_ENV}" TIMEOUT 600)
endforeach()
# cpu and emulated-cuda pre-training runs side by side (7 pairs, one under mpirun): over 600 s on a shared 2-core VM
set_tests_properties(lua_test_cuda_pretrain PROPERTIES TIMEOUT 1500)
# four pairs of emulated-cuda pre-training runs, with and without --cuda-graph (one changes the batch shape in
# mid-run), and a killed and resumed graphed run: ~6 min on an idle 2-core VM, 26 min at load 9
set_tests_properties(lua_test_cuda_graph PROPERTIES TIMEOUT 2400)
# three pairs of tiny SQuAD fine-tunings (cpu/cuda fp32 and bf16, 1 rank/2 ranks): ~3 min each pair when loaded
set_tests_properties(lua_test_cuda_squad PROPERTIES TIMEOUT 1200)
# 2-rank emulated pre-training (6 steps) with and without --cuda-graph and four 2-rank reducer scripts: ~3 min on an
# idle 2-core VM, ~15 min at load 15
set_tests_properties(lua_test_cuda_graph_dp PROPERTIES TIMEOUT 1800)
# a real MiniLM fine-tuned twice (bertlua, then transformers): ~2.5 min in Release, 8-10 min in the ASan build
set_tests_properties(lua_test_finetune_f1 PROPERTIES TIMEOUT 1200)
# squad_accuracy.lua at a tiny scale: 6 real-MiniLM fine-tunings of 5 steps (3 sides x 2 seeds), ~2.5 min idle
set_tests_properties(lua_test_squad_seeds PROPERTIES TIMEOUT 1200)
# today's CPU peers (.venv-peers) end to end, 9 peer processes, a torch.compile of 2-3 min at load 12
set_tests_properties(lua_test_benchmark_peers PROPERTIES TIMEOUT 1200)
# the GELU epilogue ops, a gelu_new BERT step and a graphed gelu_new pre-training pair: ~45 s on the emulated device
# at load 8, ~5 min while a timing at high priority held the cores
set_tests_properties(lua_test_cuda_gelu_epilogue PROPERTIES TIMEOUT 1200)
# 26 attention cases with host f64 bounds on the emulated device (masks with skipped key tiles among them)
set_tests_properties(c_test_cuda_attention PROPERTIES TIMEOUT 1200)

file(GLOB BL_HOSTILE_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/hostile/test_*.lua)
foreach(src ${BL_HOSTILE_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME hostile_${name} COMMAND bertlua_host ${src} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(hostile_${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1800
    ENVIRONMENT "${BL_TEST_ENV};OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endforeach()

file(GLOB BL_MPI_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/mpi/test_*.lua)
foreach(src ${BL_MPI_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME mpi_${name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --allow-run-as-root
            $<TARGET_FILE:bertlua_host> ${src}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(mpi_${name} PROPERTIES SKIP_RETURN_CODE 77
    ENVIRONMENT "${BL_TEST_ENV};OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" TIMEOUT 600)
endforeach()

# libFuzzer targets (clang only): cmake -DCMAKE_C_COMPILER=clang -DBERTLUA_FUZZ=ON
# registers a short run of each as a test; longer runs: ./fuzz_wikitext -max_total_time=600
option(BERTLUA_FUZZ "Build libFuzzer targets (needs clang)" OFF)
if(BERTLUA_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz_wikitext tests/fuzz/fuzz_wikitext.c src/corpus/wikitext.c src/corpus/entities.c src/corpus/sentences.c)
  target_compile_definitions(fuzz_wikitext PRIVATE BL_FUZZ_STANDALONE)
  target_include_directories(fuzz_wikitext PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(fuzz_wikitext PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_wikitext PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_wikitext PRIVATE PkgConfig::UTF8PROC)
  add_test(NAME fuzz_wikitext_short COMMAND fuzz_wikitext -max_total_time=20 -max_len=65536 -timeout=5)
  add_executable(fuzz_tokenizer tests/fuzz/fuzz_tokenizer.c src/text/tokenizer.c src/text/vocab.c src/base/open.c)
  target_compile_definitions(fuzz_tokenizer PRIVATE BL_FUZZ_STANDALONE)
  target_include_directories(fuzz_tokenizer PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(fuzz_tokenizer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_tokenizer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_tokenizer PRIVATE PkgConfig::UTF8PROC)
  add_test(NAME fuzz_tokenizer_short COMMAND fuzz_tokenizer -max_total_time=20 -max_len=65536 -timeout=5)
  set_tests_properties(fuzz_tokenizer_short PROPERTIES ENVIRONMENT "BL_FUZZ_VOCAB=${BL_SHARED_DATA}/vocab/bert-base-uncased-vocab.txt")
  # checkpoint readers, seeded with files TensorFlow / torch.save wrote (tests/fuzz/corpus/NAME)
  foreach(name tf_checkpoint torch_checkpoint)
    add_executable(fuzz_${name} tests/fuzz/fuzz_${name}.c src/io/${name}.c src/io/ckpt.c src/io/crc32c.c src/io/file.c
      src/base/open.c)
    if(name STREQUAL "torch_checkpoint")
      target_sources(fuzz_${name} PRIVATE src/io/torch_zip.c)   # the zip side of the torch reader
    endif()
    # index-block and data.pkl checksums off: mutated inputs then reach the parsers behind them
    target_compile_definitions(fuzz_${name} PRIVATE BL_FUZZ_STANDALONE FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
    target_include_directories(fuzz_${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/src/io)
    target_compile_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(fuzz_${name} PRIVATE Threads::Threads)
    # a copy of the seeds: libFuzzer adds what it finds to the first corpus directory
    add_test(NAME fuzz_${name}_short COMMAND sh -c "rm -rf corpus_${name} && \
cp -r ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${name} corpus_${name} && \
./fuzz_${name} corpus_${name} -max_total_time=20 -max_len=65536 -timeout=5")
  endforeach()
endif()

# Self-tests of the emulated CUDA libraries (tests/emu) on a test double of the
# emulated device: they check the libraries' own logic in every build.
add_executable(test_emu_cublaslt tests/emu/emu_cublaslt.cpp tests/emu/selftest/emu_double.cpp
               tests/emu/selftest/test_emu_cublaslt.cpp)
target_include_directories(test_emu_cublaslt BEFORE PRIVATE
  ${CMAKE_SOURCE_DIR}/tests/emu/selftest ${CMAKE_SOURCE_DIR}/tests/emu)
target_compile_options(test_emu_cublaslt PRIVATE ${BL_WARN})
target_link_libraries(test_emu_cublaslt PRIVATE PkgConfig::OPENBLAS m)
add_test(NAME emu_cublaslt COMMAND test_emu_cublaslt)
set_tests_properties(emu_cublaslt PROPERTIES ENVIRONMENT "${BL_TEST_ENV}" TIMEOUT 300)

# kernels/ptx.cuh's inline PTX on a real GPU, lane by lane (the emulated build runs the same file as emu_test_ptx).
if(BL_HAVE_CUDA AND NOT BERTLUA_CUDA_EMU)
  add_executable(test_ptx tests/emu/test_ptx.cu)
  target_link_libraries(test_ptx PRIVATE CUDA::cudart)
  add_test(NAME cuda_test_ptx COMMAND test_ptx)
  set_tests_properties(cuda_test_ptx PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)
endif()

# The emulated NCCL across two MPI ranks on the emulated device (emulated builds only).
if(BERTLUA_CUDA_EMU)
  add_executable(test_emu_nccl tests/emu/selftest/test_emu_nccl.cpp)
  target_include_directories(test_emu_nccl BEFORE PRIVATE ${CMAKE_SOURCE_DIR}/tests/emu)
  target_compile_options(test_emu_nccl PRIVATE ${BL_WARN})
  target_link_libraries(test_emu_nccl PRIVATE bertlua MPI::MPI_C)
  add_test(NAME emu_nccl COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --allow-run-as-root
           $<TARGET_FILE:test_emu_nccl>)
  set_tests_properties(emu_nccl PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
    ENVIRONMENT "${BL_TEST_ENV};OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()
