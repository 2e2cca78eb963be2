# Runs one fuzzer for the ctest fuzz.<name>: copies the seed corpus SEEDS into a fresh WORK
# directory in the build tree, then runs FUZZER with ARGS (a list ending with the corpus
# directory). Fails when the fuzzer does (a crash, a leak, a timeout or an invariant abort);
# the reproducer is then WORK/crash-* (or leak-*, timeout-*).
#   cmake -DSEEDS=... -DWORK=... -DFUZZER=... -DARGS=... -P run_fuzzer.cmake
foreach(var SEEDS WORK FUZZER ARGS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: ${var} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus)
file(GLOB seeds ${SEEDS}/*)
if(seeds)
  file(COPY ${seeds} DESTINATION ${WORK}/corpus)
endif()
execute_process(COMMAND ${FUZZER} ${ARGS} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); reproducers, if any, are in ${WORK}")
endif()
