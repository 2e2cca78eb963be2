# Runs one fuzzer for the ctest fuzz.<name>: makes a fresh, empty WORK/corpus (the first
# corpus directory of ARGS, the one libFuzzer adds its finds to; the others, the checked-in
# corpus and the build's seeds, are only read), then runs FUZZER with ARGS. Fails when the
# fuzzer does (a crash, a leak, a timeout or an invariant abort); the reproducer is then
# WORK/crash-* (or leak-*, timeout-*, oom-*).
#   cmake -DWORK=... -DFUZZER=... -DARGS=... -P run_fuzzer.cmake
foreach(var WORK FUZZER ARGS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: ${var} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus)
execute_process(COMMAND ${FUZZER} ${ARGS} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); reproducers, if any, are in ${WORK}; "
                      "replay one with: ${FUZZER} ${WORK}/crash-...")
endif()
file(GLOB found ${WORK}/corpus/*)
list(LENGTH found nfound)
message(STATUS "${nfound} new inputs in ${WORK}/corpus (tools/fuzz.sh merges what a longer "
               "run finds into tests/fuzz/corpus)")
